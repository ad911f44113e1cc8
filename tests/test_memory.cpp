// The KV-cache memory calculator against figures worked out by hand (in the comments), the formulas'
// proportions (so that a broken factor fails), the paged-versus-contiguous waste of a small example,
// the deterministic spread of lengths, and every error path.
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "memory_model.h"
#include "paged.h"
#include "property.h"
#include "test_util.h"

using kvlab::Error;
using kvlab::find_shape;
using kvlab::kv_bits_per_token;
using kvlab::kv_bytes;
using kvlab::kv_bytes_per_token;
using kvlab::PublishedShape;

namespace {

constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

PublishedShape toy(int n_layers, int n_kv_heads, int head_size) {
    return {"toy", n_layers, n_kv_heads, n_kv_heads, head_size, 0, 0, "test"};
}

}  // namespace

TEST_CASE("published shapes have the published figures", "[memory]") {
    const auto& shapes = kvlab::published_shapes();
    REQUIRE(shapes.size() == 6);
    const auto check = [](const char* name, int n_layers, int n_heads, int n_kv_heads, int head_size, int latent,
                          int rope) {
        const PublishedShape& s = find_shape(name);
        CHECK(s.name == name);
        CHECK(s.n_layers == n_layers);
        CHECK(s.n_heads == n_heads);
        CHECK(s.n_kv_heads == n_kv_heads);
        CHECK(s.head_size == head_size);
        CHECK(s.mla_latent == latent);
        CHECK(s.mla_rope == rope);
        CHECK(!s.source.empty());
        CHECK(s.source.find('\n') == std::string::npos);
    };
    check("Llama 2 7B", 32, 32, 32, 128, 0, 0);
    check("Llama 3 8B", 32, 32, 8, 128, 0, 0);
    check("Llama 3 70B", 80, 64, 8, 128, 0, 0);
    check("Mistral 7B", 32, 32, 8, 128, 0, 0);
    check("GPT-3 175B", 96, 96, 96, 128, 0, 0);
    check("DeepSeek-V3", 61, 128, 128, 128, 512, 64);
}

TEST_CASE("model names match ignoring case, spaces and dashes, and unknown ones list the valid names", "[memory]") {
    CHECK(find_shape("llama2-7b").name == "Llama 2 7B");
    CHECK(find_shape("LLAMA-3-70B").name == "Llama 3 70B");
    CHECK(find_shape("llama 3 8b").name == "Llama 3 8B");
    CHECK(find_shape("mistral-7b").name == "Mistral 7B");
    CHECK(find_shape("gpt3 175b").name == "GPT-3 175B");
    CHECK(find_shape("deepseekv3").name == "DeepSeek-V3");
    CHECK_THROWS_AS(find_shape("llama2-13b"), Error);
    CHECK_THROWS_AS(find_shape(""), Error);
    CHECK_THROWS_WITH(find_shape("gpt-4"),
                      Catch::Contains("gpt-4") && Catch::Contains("Llama 2 7B") && Catch::Contains("DeepSeek-V3"));
}

TEST_CASE("precisions: fp32 fp16 fp8 int4 int2, bf16 as 16 bits, unknown names listed", "[memory]") {
    const auto& p = kvlab::precisions();
    REQUIRE(p.size() == 5);
    CHECK(p[0].name == "fp32");
    CHECK(p[0].bits == 32);
    CHECK(p[4].name == "int2");
    CHECK(p[4].bits == 2);
    CHECK(kvlab::parse_precision("fp16").bits == 16);
    CHECK(kvlab::parse_precision("bf16").bits == 16);
    CHECK(kvlab::parse_precision("BF16").name == "bf16");
    CHECK(kvlab::parse_precision("FP8").bits == 8);
    CHECK(kvlab::parse_precision("int4").bits == 4);
    CHECK_THROWS_AS(kvlab::parse_precision("fp12"), Error);
    CHECK_THROWS_WITH(kvlab::parse_precision("int3"),
                      Catch::Contains("int3") && Catch::Contains("bf16") && Catch::Contains("int2"));
}

TEST_CASE("bytes per token match the hand-computed figures", "[memory]") {
    const auto bytes16 = [](const char* name) { return kv_bytes_per_token(find_shape(name), 16); };
    // 2 (K, V) * 32 layers * 32 KV heads * 128 * 2 bytes = 524,288 = 0.5 MiB.
    CHECK(bytes16("Llama 2 7B") == 524'288);
    CHECK(bytes16("Llama 2 7B") == MiB / 2);
    // GQA: 2 * 32 * 8 * 128 * 2 = 131,072 (a quarter of Llama 2 7B's: 8 KV heads instead of 32).
    CHECK(bytes16("Llama 3 8B") == 131'072);
    // 2 * 80 * 8 * 128 * 2 = 327,680.
    CHECK(bytes16("Llama 3 70B") == 327'680);
    // Same KV shape as Llama 3 8B: 2 * 32 * 8 * 128 * 2 = 131,072.
    CHECK(bytes16("Mistral 7B") == 131'072);
    // 2 * 96 * 96 * 128 * 2 = 4,718,592 = 4.5 MiB.
    CHECK(bytes16("GPT-3 175B") == 4'718'592);
    // MLA: 61 layers * (512 + 64) * 2 = 70,272: no factor 2 for K and V, no head count.
    CHECK(bytes16("DeepSeek-V3") == 70'272);

    // The other precisions scale it: fp32 doubles, fp8 halves, int4 quarters, int2 eighths fp16's figure.
    const PublishedShape& llama2 = find_shape("Llama 2 7B");
    CHECK(kv_bytes_per_token(llama2, 32) == 1'048'576);
    CHECK(kv_bytes_per_token(llama2, 8) == 262'144);
    CHECK(kv_bytes_per_token(llama2, 4) == 131'072);
    CHECK(kv_bytes_per_token(llama2, 2) == 65'536);
    const PublishedShape& ds = find_shape("DeepSeek-V3");
    CHECK(kv_bytes_per_token(ds, 4) == 17'568);  // 61 * 576 / 2
    CHECK(kv_bytes_per_token(ds, 2) == 8'784);   // 61 * 576 / 4
    // 61 * 576 * 2 bits = 70,272 bits.
    CHECK(kv_bits_per_token(ds, 2) == 70'272);

    // Every published shape is a whole number of bytes per token at every precision: nothing rounds.
    for (const auto& s : kvlab::published_shapes())
        for (const auto& p : kvlab::precisions()) {
            INFO(s.name << " at " << p.name);
            CHECK(kv_bits_per_token(s, p.bits) % 8 == 0);
            CHECK(kv_bytes_per_token(s, p.bits) * 8 == kv_bits_per_token(s, p.bits));
        }
}

TEST_CASE("totals for context x batch are exact, and GPT-3 at fp32, 128K x 64 fits in int64", "[memory]") {
    const PublishedShape& llama2 = find_shape("Llama 2 7B");
    // 524,288 B * 4096 tokens = 2^19 * 2^12 = 2^31 = 2 GiB.
    CHECK(kv_bytes(llama2, 16, 4096, 1) == 2 * GiB);
    CHECK(kv_bytes(llama2, 16, 4096, 8) == 16 * GiB);
    CHECK(kv_bytes(llama2, 4, 4096, 1) == GiB / 2);
    // 9,437,184 B (= 9 * 2^20) * 131,072 (2^17) * 64 (2^6) = 9 * 2^43 = 79,164,837,199,872 B = 72 TiB.
    CHECK(kv_bytes(find_shape("GPT-3 175B"), 32, 131'072, 64) == 79'164'837'199'872);
    // 70,272 * 128 * 1024 (DeepSeek-V3's 128K context) = 9,210,691,584 B.
    CHECK(kv_bytes(find_shape("DeepSeek-V3"), 16, 131'072, 1) == 9'210'691'584);
}

TEST_CASE("the formulas scale with each factor (a broken factor fails here)", "[memory]") {
    const int bits = 16;
    const std::int64_t base = kv_bits_per_token(toy(3, 5, 7), bits);
    CHECK(base == 2 * 3 * 5 * 7 * 16);
    // Linear in n_kv_heads, n_layers and head_size, separately.
    for (int k = 1; k <= 9; k++) {
        CHECK(kv_bits_per_token(toy(3, 5 * k, 7), bits) == k * base);
        CHECK(kv_bits_per_token(toy(3 * k, 5, 7), bits) == k * base);
        CHECK(kv_bits_per_token(toy(3, 5, 7 * k), bits) == k * base);
    }
    // Linear in bits, in context and in batch.
    CHECK(kv_bits_per_token(toy(3, 5, 7), 4) * 4 == base);
    CHECK(kv_bytes(toy(3, 5, 7), bits, 10, 1) * 3 == kv_bytes(toy(3, 5, 7), bits, 30, 1));
    CHECK(kv_bytes(toy(3, 5, 7), bits, 10, 6) == kv_bytes(toy(3, 5, 7), bits, 60, 1));
    // Query heads cost nothing: only n_kv_heads is cached.
    PublishedShape more_queries = toy(3, 5, 7);
    more_queries.n_heads = 40;
    CHECK(kv_bits_per_token(more_queries, bits) == base);
    // GQA with 4 query heads per KV head: Llama 2 7B holds 4x the cache of Llama 3 8B (same layers, head_size).
    CHECK(kv_bits_per_token(find_shape("Llama 2 7B"), bits) == 4 * kv_bits_per_token(find_shape("Llama 3 8B"), bits));

    // MLA: latent + rope per layer, independent of the head counts and head_size.
    PublishedShape mla = find_shape("DeepSeek-V3");
    const std::int64_t mla_base = kv_bits_per_token(mla, bits);
    mla.n_kv_heads = 1;
    mla.head_size = 1;
    CHECK(kv_bits_per_token(mla, bits) == mla_base);
    mla.mla_latent = 512 + 576;  // latent + rope doubles
    CHECK(kv_bits_per_token(mla, bits) == 2 * mla_base);
    mla.mla_latent = 512;
    mla.n_layers = 122;
    CHECK(kv_bits_per_token(mla, bits) == 2 * mla_base);
}

TEST_CASE("sub-byte totals are exact in bits and round up to a whole byte only at the end", "[memory]") {
    const PublishedShape t = toy(1, 1, 1);  // 2 elements per token
    CHECK(kv_bits_per_token(t, 2) == 4);    // half a byte
    CHECK(kv_bytes_per_token(t, 2) == 1);   // rounded up
    CHECK(kv_bytes(t, 2, 2, 1) == 1);       // 8 bits: exactly 1 byte, not 2 rounded halves
    CHECK(kv_bytes(t, 2, 3, 1) == 2);       // 12 bits
    CHECK(kv_bytes(t, 2, 1, 4) == 2);       // 16 bits
    CHECK(kv_bytes(t, 4, 1, 1) == 1);       // 8 bits
}

TEST_CASE("contiguous versus paged reservation: a hand-worked example", "[memory]") {
    // Lengths 1, 16, 17, 100 with max_seq 128 and block_size 16:
    //   used        1 + 16 + 17 + 100 = 134
    //   paged       16 + 16 + 32 + 112 = 176 (1, 1, 2 and 7 blocks)
    //   contiguous  4 * 128 = 512
    const auto w = kvlab::reservation_waste({1, 16, 17, 100}, 128, 16);
    CHECK(w.n_requests == 4);
    CHECK(w.min_len == 1);
    CHECK(w.max_len == 100);
    CHECK(w.used == 134);
    CHECK(w.mean_len() == 33.5);
    CHECK(w.paged_reserved == 176);
    CHECK(w.contiguous_reserved == 512);
    CHECK(w.contiguous_waste_fraction == Approx(378.0 / 512.0));  // 0.738
    CHECK(w.paged_waste_fraction == Approx(42.0 / 176.0));        // 0.239

    // block_size 1 wastes nothing; block_size = max_seq is contiguous reservation again.
    const auto exact = kvlab::reservation_waste({1, 16, 17, 100}, 128, 1);
    CHECK(exact.paged_reserved == 134);
    CHECK(exact.paged_waste_fraction == 0.0);
    CHECK(kvlab::reservation_waste({1, 16, 17, 100}, 128, 128).paged_reserved == 512);
    // Full-length requests waste nothing either way.
    const auto full = kvlab::reservation_waste({128, 128}, 128, 16);
    CHECK(full.contiguous_waste_fraction == 0.0);
    CHECK(full.paged_waste_fraction == 0.0);
}

TEST_CASE("spread_lengths is deterministic, uniform and inside its range", "[memory]") {
    // splitmix64 from seed 1234567 starts 6457827717110365317, 3203168211198807973, 9817491932198370423,
    // 4593380528125082431, 16408922859458223821 (the generator's published test sequence); modulo 1000, plus 1.
    CHECK(kvlab::spread_lengths(5, 1, 1000, 1234567) == std::vector<int>{318, 974, 424, 432, 822});

    CHECK(kvlab::spread_lengths(100, 1, 4096, 7) == kvlab::spread_lengths(100, 1, 4096, 7));
    CHECK(kvlab::spread_lengths(100, 1, 4096, 7) != kvlab::spread_lengths(100, 1, 4096, 8));
    CHECK(kvlab::spread_lengths(10, 5, 5, 3) == std::vector<int>(10, 5));

    const auto v = kvlab::spread_lengths(40'000, 3, 6, 11);
    int counts[4] = {0, 0, 0, 0}, outside = 0;
    for (int len : v) {
        if (len < 3 || len > 6)
            outside++;
        else
            counts[len - 3]++;
    }
    CHECK(outside == 0);
    // Each value expects 10,000; the standard deviation is about 87.
    for (int c : counts) CHECK((c > 9'500 && c < 10'500));
    // The whole int range is a valid range.
    const auto wide = kvlab::spread_lengths(100, 1, 2'147'483'647, 1);
    CHECK(std::all_of(wide.begin(), wide.end(), [](int len) { return len >= 1; }));
}

TEST_CASE("every bad input is a one-line kvlab::Error", "[memory][errors]") {
    const PublishedShape& llama2 = find_shape("Llama 2 7B");
    CHECK_THROWS_AS(kv_bytes(llama2, 16, 0, 1), Error);  // context < 1
    CHECK_THROWS_AS(kv_bytes(llama2, 16, -5, 1), Error);
    CHECK_THROWS_AS(kv_bytes(llama2, 16, 4096, 0), Error);  // batch < 1
    CHECK_THROWS_AS(kv_bytes(llama2, 0, 4096, 1), Error);   // bits < 1
    CHECK_THROWS_AS(kv_bits_per_token(toy(0, 8, 128), 16), Error);
    CHECK_THROWS_AS(kv_bits_per_token(toy(32, 0, 128), 16), Error);
    CHECK_THROWS_AS(kv_bits_per_token(toy(32, 8, 0), 16), Error);
    // 75,497,472 bits per token * 2^24 * 2^20 is past int64: refused, not wrapped.
    CHECK_THROWS_WITH(kv_bytes(find_shape("GPT-3 175B"), 32, std::int64_t{1} << 24, std::int64_t{1} << 20),
                      Catch::Contains("64-bit"));

    using kvlab::reservation_waste;
    CHECK_THROWS_AS(reservation_waste({}, 128, 16), Error);
    CHECK_THROWS_AS(reservation_waste({1, 2}, 128, 0), Error);  // block_size < 1
    CHECK_THROWS_AS(reservation_waste({1, 2}, 128, -16), Error);
    CHECK_THROWS_AS(reservation_waste({1, 0}, 128, 16), Error);  // length < 1
    CHECK_THROWS_AS(reservation_waste({1, -3}, 128, 16), Error);
    CHECK_THROWS_AS(reservation_waste({1, 129}, 128, 16), Error);  // length > max_seq
    CHECK_THROWS_AS(reservation_waste({1}, 0, 16), Error);         // context < 1

    CHECK_THROWS_AS(kvlab::spread_lengths(0, 1, 10, 1), Error);
    CHECK_THROWS_AS(kvlab::spread_lengths(5, 0, 10, 1), Error);
    CHECK_THROWS_AS(kvlab::spread_lengths(5, 10, 9, 1), Error);

    // One line each.
    const auto message = [](auto&& f) {
        try {
            f();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    for (const std::string& m :
         {message([&] { kv_bytes(llama2, 16, 0, 1); }), message([&] {
              reservation_waste({1, 129}, 128, 16);
          }),
          message([] { find_shape("bad\nname"); }), message([] { kvlab::parse_precision("bad\nname"); })}) {
        INFO(m);
        CHECK(m != "no error");
        CHECK(m.find('\n') == std::string::npos);
    }
}

// ----------------------------------------------------------------------------------------------
// The tie between proofs/coq/Memory.v and the C++: its definitions, transcribed here literally,
// against every C++ function that computes a cache size, and its theorems checked on the C++
// figures. A C++ formula that drifts from the proven one fails here.

namespace {

// Memory.v: contiguous b n_layers n_kv_heads head_size T = 2 * b * n_layers * T * n_kv_heads * head_size
std::int64_t coq_contiguous(std::int64_t b, std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_size,
                            std::int64_t T) {
    return 2 * b * n_layers * T * n_kv_heads * head_size;
}
// Memory.v: blocks bs T = (T + bs - 1) / bs;  paged = contiguous (blocks bs T * bs)
std::int64_t coq_blocks(std::int64_t bs, std::int64_t T) { return (T + bs - 1) / bs; }

struct Sizes {
    std::int64_t contiguous, paged_reserved, block;
};

// What the C++ reports for one sequence of T positions, by every path that computes it.
using SizeCheck = std::optional<std::string> (*)(const kvlab::Config&, int block_size, int T, Sizes&);

std::optional<std::string> cpp_sizes(const kvlab::Config& c, int block_size, int T, Sizes& out) {
    const int n_blocks = int(coq_blocks(block_size, std::max(T, 1)));
    kvlab::BlockPool pool(c, block_size, n_blocks);
    kvlab::PagedCache cache(pool);
    std::vector<int> tokens(std::size_t(T), 1);
    if (T > 0) cache.append(tokens);
    const kvlab::MemoryStats m = cache.memory();
    out = {kvlab::kv_bytes(c, T), m.reserved_bytes, pool.block_bytes()};
    if (m.used_bytes != out.contiguous)
        return fmt::format("PagedCache used_bytes {} != kv_bytes {}", m.used_bytes, out.contiguous);
    if (T > 0) {
        const auto w = kvlab::reservation_waste({T}, c.max_seq, block_size);
        if (w.paged_reserved * kvlab::kv_bytes(c, 1) != m.reserved_bytes)
            return fmt::format("reservation_waste reserves {} positions, the paged cache {} bytes", w.paged_reserved,
                               m.reserved_bytes);
        const PublishedShape shape{"p", c.n_layers, c.n_heads, c.n_kv_heads, c.head_size(), 0, 0, "test"};
        for (int bits : {8, 16, 32})
            if (kv_bytes(shape, bits, T, 1) != coq_contiguous(bits / 8, c.n_layers, c.n_kv_heads, c.head_size(), T))
                return fmt::format("kvlab memory at {} bits: {} bytes", bits, kv_bytes(shape, bits, T, 1));
    }
    return std::nullopt;
}

void memory_tie_property(SizeCheck sizes) {
    const int n_kv_heads = *kvlab::test::full_range(1, 4), group = *kvlab::test::full_range(1, 3);
    const int head_size = 2 * *kvlab::test::full_range(1, 8), block_size = *kvlab::test::full_range(1, 9);
    kvlab::Config c;
    c.n_layers = *kvlab::test::full_range(1, 4);
    c.n_heads = group * n_kv_heads;
    c.n_kv_heads = n_kv_heads;
    c.dim = c.n_heads * head_size;
    c.hidden_dim = 8;
    c.vocab_size = 8;
    c.max_seq = 40;
    const int T = *kvlab::test::full_range(0, c.max_seq);
    Sizes s;
    if (auto bad = sizes(c, block_size, T, s)) RC_FAIL(*bad);
    const std::int64_t L = c.n_layers, hs = head_size;
    RC_ASSERT(s.contiguous == coq_contiguous(4, L, n_kv_heads, hs, T));
    RC_ASSERT(s.block == coq_contiguous(4, L, n_kv_heads, hs, block_size));
    if (T > 0) RC_ASSERT(s.paged_reserved == coq_contiguous(4, L, n_kv_heads, hs, coq_blocks(block_size, T) * block_size));
    // paged_bounds, on the C++ figures: at least the contiguous bytes, less than one block more.
    RC_ASSERT(s.contiguous <= s.paged_reserved);
    RC_ASSERT(s.paged_reserved < s.contiguous + s.block);
    // gqa_saving: the same model with a KV head per query head caches `group` times as much.
    kvlab::Config mha = c;
    mha.n_kv_heads = c.n_heads;
    RC_ASSERT(kvlab::kv_bytes(mha, T) == group * kvlab::kv_bytes(c, T));
}

}  // namespace

TEST_CASE("every C++ cache size is the formula proven in proofs/coq/Memory.v, and obeys its theorems",
          "[memory][proofs]") {
    rc::prop("kv_bytes, PagedCache::memory, reservation_waste and kvlab memory agree with Memory.v",
             [] { memory_tie_property(cpp_sizes); });
}

TEST_CASE("counter-test: a paged size off by one block is caught by the Memory.v tie", "[memory][proofs][counter]") {
    const auto outcome = kvlab::check_property(
        [] {
            memory_tie_property([](const kvlab::Config& c, int block_size, int T, Sizes& out) {
                auto bad = cpp_sizes(c, block_size, T, out);
                out.paged_reserved += out.block;  // one block too many: what a rounding bug in blocks() reports
                return bad;
            });
        },
        100, 1);
    INFO(outcome.counterexample);
    CHECK_FALSE(outcome.passed);
    CHECK(outcome.cases <= 2);
}
