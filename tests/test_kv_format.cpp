// The KV float formats (core/kv_format.h) against an oracle written another way
// (proofs/format_oracle.h: each code's value from its fields in double, and fp32 -> format as a
// nearest search over every code's value). Every code of every format is checked,
// and fp32 inputs three ways: a million drawn around the format's own values (midpoints, their
// fp32 neighbours, the overflow edge, subnormals) plus random bit patterns in the default run,
// and all 2^32 in the slow-labelled test (`KVLAB_EXHAUSTIVE=1`, `ctest -L slow`).
#include <fmt/format.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compare.h"
#include "cpu_backend.h"
#include "decode.h"
#include "format_oracle.h"
#include "host_backend.h"
#include "kv_format.h"
#include "paged.h"
#include "property.h"
#include "quantized_cache.h"
#include "test_util.h"
#include "window_cache.h"

using namespace kvlab;
using namespace kvlab::proofs;

namespace {

struct Named {
    const char* name;
    FloatFormat f;
};
const Named kFormats[] = {{"bf16", kBf16}, {"fp16", kFp16}, {"fp8-e5m2", kFp8E5M2}, {"fp8-e4m3", kFp8E4M3}};

std::string hex(std::uint32_t v) { return fmt::format("0x{:x}", v); }

// One input: implementation == oracle, or a line saying how they differ.
std::optional<std::string> differs(const Named& n, const FormatTable& t, float x, std::size_t hint = kSearch) {
    const std::uint32_t got = encode_float(n.f, x), want = oracle_encode(n.f, t, x, hint);
    if (got == want) return std::nullopt;
    return fmt::format("{}: fp32 {} ({}) encodes to {}, the oracle says {}", n.name, x,
                       hex(std::bit_cast<std::uint32_t>(x)), hex(got), hex(want));
}

}  // namespace

TEST_CASE("KV formats: every code decodes to the value its fields give, and encodes back to itself", "[kv-format]") {
    for (const Named& n : kFormats) {
        const std::uint32_t n_codes = 1u << n.f.bits();
        int checked = 0;
        for (std::uint32_t c = 0; c < n_codes; c++) {
            const CodeMeaning m = code_meaning(n.f, c);
            const float got = decode_float(n.f, c);
            INFO(n.name << " code " << hex(c));
            if (m.nan) {
                CHECK(std::isnan(got));
                CHECK(std::signbit(got) == m.negative);
                continue;
            }
            if (m.inf) {
                CHECK((std::isinf(got) && std::signbit(got) == m.negative));
                CHECK(encode_float(n.f, got) == c);
                continue;
            }
            // Bitwise: -0 and +0 are told apart.
            if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(float(m.value)))
                FAIL(n.name << " code " << hex(c) << " decodes to " << got << ", its fields say " << m.value);
            if (encode_float(n.f, got) != c)
                FAIL(n.name << " code " << hex(c) << " -> " << got << " encodes to " << hex(encode_float(n.f, got)));
            checked++;
        }
        CHECK(checked > int(n_codes) / 2);
    }
}

TEST_CASE("KV formats: the table of NUMERICS.md (largest finite value, infinity, NaN)", "[kv-format]") {
    CHECK(decode_float(kBf16, kBf16.max_finite()) == 0x1.fep127f);
    CHECK(decode_float(kFp16, kFp16.max_finite()) == 65504.0f);
    CHECK(decode_float(kFp8E5M2, kFp8E5M2.max_finite()) == 57344.0f);
    CHECK(decode_float(kFp8E4M3, kFp8E4M3.max_finite()) == 448.0f);
    CHECK(encode_float(kFp8E4M3, 1e9f) == 0x7eu);                                     // saturates
    CHECK(encode_float(kFp8E4M3, -std::numeric_limits<float>::infinity()) == 0xffu);  // no infinity: NaN
    CHECK(encode_float(kFp16, 1e9f) == 0x7bffu);
    CHECK(encode_float(kFp16, std::numeric_limits<float>::infinity()) == 0x7c00u);
    CHECK(encode_float(kBf16, -0.0f) == 0x8000u);
    CHECK(encode_float(kFp8E5M2, -1e-30f) == 0x80u);  // rounds to zero, keeps its sign
    CHECK(encode_float(kBf16, std::numeric_limits<float>::quiet_NaN()) == 0x7fc0u);
}

TEST_CASE("KV formats: fp32 -> each format equals the oracle on a million inputs around the format's values",
          "[kv-format]") {
    std::uint64_t state = 0x6b766c6162ull;  // "kvlab": a fixed stream, so a failure reruns as it was
    for (const Named& n : kFormats) {
        const FormatTable t = format_table(n.f);
        std::vector<float> xs = format_edge_inputs(t);
        while (xs.size() < 250000) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            xs.push_back(std::bit_cast<float>(std::uint32_t(state >> 32)));
        }
        int wrong = 0;
        for (float x : xs)
            if (const auto d = differs(n, t, x); d && wrong++ < 5) FAIL_CHECK(*d);
        INFO(n.name << ": " << xs.size() << " inputs");
        CHECK(wrong == 0);
    }
}

TEST_CASE("KV formats counter-test: the oracle catches a conversion that truncates", "[kv-format][counter]") {
    // bf16 by dropping the low 16 bits: what engines' fast paths do, and what the format must not.
    const FormatTable t = format_table(kBf16);
    int caught = 0;
    for (float x : format_edge_inputs(t)) {
        const std::uint32_t truncated = std::bit_cast<std::uint32_t>(x) >> 16;
        if (!std::isnan(x) && truncated != oracle_encode(kBf16, t, x)) caught++;
    }
    CHECK(caught > 0);
}

TEST_CASE("KV formats, exhaustive: fp32 -> each format equals the oracle on all 2^32 inputs", "[kv-format][slow]") {
    if (!std::getenv("KVLAB_EXHAUSTIVE")) {
        WARN("set KVLAB_EXHAUSTIVE=1 (ctest -L slow does) to run all 2^32 inputs");
        return;
    }
    for (const Named& n : kFormats) {
        const FormatTable t = format_table(n.f);
        std::uint64_t wrong = 0;
        // Non-negative finite fp32 bit patterns are increasing in value: walk the table alongside.
        std::size_t hi = 0;
        for (std::uint64_t u = 0; u < 0x7f800000ull; u++) {
            const float x = std::bit_cast<float>(std::uint32_t(u));
            while (hi < t.by_value.size() && t.by_value[hi].first < double(x)) hi++;
            const std::size_t hint = hi < t.by_value.size() ? hi : kSearch;
            for (float s : {x, -x})
                if (const auto d = differs(n, t, s, hint); d && wrong++ < 5) FAIL_CHECK(*d);
        }
        for (std::uint64_t u = 0x7f800000ull; u < 0x80000000ull; u++)  // infinity and the NaNs
            for (float s : {std::bit_cast<float>(std::uint32_t(u)), -std::bit_cast<float>(std::uint32_t(u))})
                if (const auto d = differs(n, t, s); d && wrong++ < 5) FAIL_CHECK(*d);
        CHECK(wrong == 0);
    }
}

// ---- Decoding with a KV format: the cached decoder stores K and V through store_kv in the cache's
// format; the format-aware naive decode stores every position's K and V through the same kernel
// before its causal attention. The two must agree bit for bit, as in fp32.

namespace {

// A cache of one of the variants that take a format, in `format`, and the pool a paged one needs.
struct FormatCache {
    std::unique_ptr<BlockPool> pool;  // declared first: it outlives the cache
    std::unique_ptr<Cache> cache;
    std::string name;
};

// scales: [n_layers, 2], or empty for all 1.
FormatCache format_cache(const Config& c, int variant, KVFormat format, Memory& memory,
                         std::span<const float> scales = {}) {
    FormatCache f;
    switch (variant) {
        case 0: f.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::head_major, memory); break;
        case 1: f.cache = std::make_unique<ContiguousCache>(c, ContiguousCache::Layout::seq_major, memory); break;
        case 2: f.cache = std::make_unique<GrowingCache>(c, draw(1, c.max_seq), memory); break;
        default: {
            const int bs = draw(1, c.max_seq);
            f.pool = std::make_unique<BlockPool>(c, bs, (c.max_seq + bs - 1) / bs, false, memory);
            f.pool->set_kv_format(format, scales);
        }
    }
    if (f.pool) f.cache = std::make_unique<PagedCache>(*f.pool);
    f.cache->set_kv_format(format, scales);
    f.name = fmt::format("{} in {}", f.cache->name(), kv_format_name(format));
    return f;
}

// Scales [n_layers, 2] of an fp8 cache: powers of two and in-between values in [2^-5, 2^4).
std::vector<float> draw_scales(const Config& c) {
    std::vector<float> s(std::size_t(2 * c.n_layers));
    for (float& x : s) x = std::ldexp(1.0f + float(draw(0, 63)) / 64.0f, draw(-5, 3));
    return s;
}

// What the naive decode is told: the cache's format and scales (the property), fp32 (the first
// counter-test) or the cache's fp8 format without its scales (the second).
enum class NaiveAs { cache, fp32, unscaled };

// Prefill a prompt, then decode to max_seq: every step's logits equal naive decode's, storing K
// and V as `as` says.
void format_property(NaiveAs as) {
    // Tiled attention too: a tile starts at any multiple of its size, so eight rows read together
    // can straddle two of the CPU's blocks of eight decoded rows (cpu_backend.cpp HeadRows). Tiles
    // of 9 to 15 keys and contexts past 16 make that common.
    const bool tiled = draw(0, 1);
    const AttentionSpec attention =
        tiled ? AttentionSpec{AttentionSpec::Kind::tiled, draw(0, 1) ? draw(9, 15) : draw(1, 20)} : AttentionSpec{};
    Config c = draw_config(2);
    if (tiled) c.max_seq = draw(16, 40);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const int n_formats = int(std::size(kKVFormats));
    const KVFormat format = kKVFormats[std::size_t(as == NaiveAs::unscaled ? draw(3, 4) : draw(1, n_formats - 1))];
    const bool scaled = kv_format_scaled(int(format)) && (as == NaiveAs::unscaled || draw(0, 1));
    const std::vector<float> scales = scaled ? draw_scales(c) : std::vector<float>{};
    const bool on_gpu_host = draw(0, 1);
    std::unique_ptr<Backend> backend;
    if (on_gpu_host)
        backend = std::make_unique<GpuHostBackend>(m);
    else
        backend = std::make_unique<CpuBackend>(m);
    const FormatCache fc = format_cache(c, draw(0, 3), format, backend->memory(), scales);
    NaiveDecoder naive(*backend);
    naive.kv_format = as == NaiveAs::fp32 ? KVFormat::fp32 : format;
    if (as == NaiveAs::cache) naive.kv_scales = scales;
    CachedDecoder cached(*backend, *fc.cache);
    naive.exec.attention = cached.exec.attention = attention;
    std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const std::string where = fmt::format("{}{} on {}, {} attention, {}", fc.name, scaled ? " with scales" : "",
                                          on_gpu_host ? "gpu-host" : "cpu", attention_name(attention), c.describe());
    std::vector<float> got = cached.extend(tokens);
    while (true) {
        if (const auto diff = first_difference(naive.forward(tokens), got))
            RC_FAIL(fmt::format("{}: at T = {} the cached logits differ from naive decode in {}{}: {}", where,
                                tokens.size(), kv_format_name(naive.kv_format),
                                naive.kv_scales.empty() ? "" : " with the cache's scales", *diff));
        if (int(tokens.size()) == c.max_seq) break;
        tokens.push_back(draw_tokens(c, 1)[0]);
        got = cached.decode(tokens.back());
    }
}

}  // namespace

TEST_CASE("KV formats: cached decode equals the format-aware naive decode, bit for bit, every step", "[kv-format]") {
    rc::prop(
        "contiguous (both layouts), growing and paged caches in bf16, fp16, fp8-e5m2, fp8-e4m3 (fp8 with and "
        "without per-layer scales), simple and tiled attention, on cpu and gpu-host",
        [] { format_property(NaiveAs::cache); });
}

TEST_CASE("KV formats counter-test: a cache in a narrow format differs from the fp32 naive decode",
          "[kv-format][counter]") {
    test::expect_failure([] { format_property(NaiveAs::fp32); }, "differ from naive decode in fp32");
}

TEST_CASE("KV formats counter-test: an fp8 cache with scales differs from a naive decode that ignores them",
          "[kv-format][counter]") {
    test::expect_failure([] { format_property(NaiveAs::unscaled); }, "with scales on");
}

namespace {

// A quantized cache that prefills in one step: a group of per-channel keys is then quantized
// before the queries of its earlier rows run (the counter-test of QuantizedCache::max_step).
class WholePrefillQuantized final : public QuantizedCache {
public:
    using QuantizedCache::QuantizedCache;
    int max_step() const override { return config().max_seq; }
};

// A quantized cache's spec for c: 8 or 4 bits, keys per token or per channel (always, with
// per_channel), a group that divides head_size (and, per channel, fits max_seq).
QuantSpec draw_quant_spec(const Config& c, bool per_channel = false) {
    QuantSpec spec;
    spec.bits = draw(0, 1) ? 8 : 4;
    spec.key_axis = per_channel || draw(0, 1) ? QuantSpec::Axis::per_channel : QuantSpec::Axis::per_token;
    std::vector<int> groups;
    for (int g = 1; g <= c.head_size(); g++)
        if (c.head_size() % g == 0 && (spec.key_axis == QuantSpec::Axis::per_token || g <= c.max_seq))
            groups.push_back(g);
    spec.group = groups[std::size_t(draw(0, int(groups.size()) - 1))];
    return spec;
}

// The quantized cache (8 or 4 bits, keys per token or per channel, any group that fits) against
// naive decode that rounds K and V as the cache does (NaiveDecoder::quant), or in fp32 (the first
// counter-test); whole_prefill: the second counter-test's cache, keys per channel.
void quant_naive_property(bool naive_rounds, bool whole_prefill) {
    const Config c = draw_config(2);
    const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
    const QuantSpec spec = draw_quant_spec(c, whole_prefill);
    const bool on_gpu_host = draw(0, 1);
    std::unique_ptr<Backend> backend;
    if (on_gpu_host)
        backend = std::make_unique<GpuHostBackend>(m);
    else
        backend = std::make_unique<CpuBackend>(m);
    std::unique_ptr<QuantizedCache> cache =
        whole_prefill ? std::make_unique<WholePrefillQuantized>(c, spec) : std::make_unique<QuantizedCache>(c, spec);
    NaiveDecoder naive(*backend);
    if (naive_rounds) naive.quant = spec;
    CachedDecoder cached(*backend, *cache);
    const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
    const int prompt = draw(1, int(tokens.size()));
    const std::string where =
        fmt::format("{}{} on {}, {}, prompt {} of {}", cache->name(), whole_prefill ? " prefilled in one step" : "",
                    on_gpu_host ? "gpu-host" : "cpu", c.describe(), prompt, tokens.size());
    const std::span<const int> all(tokens);
    std::vector<float> got = cached.prefill(all.first(prompt));
    for (int T = prompt;; T++) {
        if (const auto diff = first_difference(naive.forward(all.first(T)), got))
            RC_FAIL(fmt::format("{}: at T = {} the cached logits differ from naive decode{}: {}", where, T,
                                naive_rounds ? " rounding K and V as the cache does" : " in fp32", *diff));
        if (T == int(tokens.size())) break;
        got = cached.decode(tokens[std::size_t(T)]);
    }
}

}  // namespace

TEST_CASE("quantized cache: cached decode equals naive decode rounding K and V as the cache does, bit for bit",
          "[kv-format][quant]") {
    rc::prop(
        "int8 and int4; keys per token or per channel (KIVI, with the fp32 residual of the open group); any "
        "group; cpu and gpu-host",
        [] { quant_naive_property(true, false); });
}

TEST_CASE("quantized cache counter-test: it differs from the fp32 naive decode", "[kv-format][quant][counter]") {
    test::expect_failure([] { quant_naive_property(false, false); }, "differ from naive decode in fp32");
}

TEST_CASE("quantized cache counter-test: prefilled in one step, per-channel keys differ from the naive rule",
          "[kv-format][quant][counter]") {
    test::expect_failure([] { quant_naive_property(true, true); }, "prefilled in one step");
}

TEST_CASE("KV formats: a variant that stores fp32 only, or a non-empty cache, refuses a format in one line",
          "[kv-format]") {
    const Config c =
        Config::parse("dim=8,hidden_dim=8,n_layers=1,n_heads=2,n_kv_heads=1,vocab_size=16,max_seq=8", Config{});
    QuantizedCache quantized(c, QuantSpec{8, QuantSpec::Axis::per_token, 4});
    CHECK_THROWS_WITH(quantized.set_kv_format(KVFormat::bf16),
                      Catch::Contains("stores K and V in fp32 only, not bf16"));
    ContiguousCache cache(c);
    cache.append(std::vector<int>{1});
    CHECK_THROWS_WITH(cache.set_kv_format(KVFormat::fp16), Catch::Contains("only while the cache is empty"));
    BlockPool pool(c, 2, 4);
    PagedCache paged(pool);
    CHECK_THROWS_WITH(paged.set_kv_format(KVFormat::fp8_e4m3), Catch::Contains("BlockPool::set_kv_format"));
    paged.append(std::vector<int>{1});  // a block in use
    CHECK_THROWS_WITH(pool.set_kv_format(KVFormat::bf16), Catch::Contains("only while no block is used"));
    CHECK_THROWS_WITH(parse_kv_format("fp8"),
                      "unknown KV format 'fp8' (fp32, bf16, fp16, fp8-e5m2, fp8-e4m3, int8, int4)");
    for (KVFormat f : kKVFormats) CHECK(parse_kv_format(kv_format_name(f)) == f);
}

// ---- Memory: a cache in a format holds its codes and scales, nothing else. The bytes its
// memory() reports are checked against what its allocator actually handed out.

namespace {

// Host memory that counts the bytes live in it.
class CountingMemory final : public Memory {
public:
    std::string_view name() const override { return "counting"; }
    bool host_visible() const override { return true; }
    void* allocate(std::int64_t bytes) override {
        void* p = host_memory().allocate(bytes);
        sizes_[p] = bytes;
        live_ += bytes;
        return p;
    }
    void deallocate(void* p) override {
        live_ -= sizes_.at(p);
        sizes_.erase(p);
        host_memory().deallocate(p);
    }
    void upload(void* dst, const void* src, std::int64_t n) override { host_memory().upload(dst, src, n); }
    void download(void* dst, const void* src, std::int64_t n) override { host_memory().download(dst, src, n); }
    void copy(void* dst, const void* src, std::int64_t n) override { host_memory().copy(dst, src, n); }
    void fill_nan(void* x, std::int64_t n, int format) override { host_memory().fill_nan(x, n, format); }
    std::int64_t live() const { return live_; }

private:
    std::map<void*, std::int64_t> sizes_;
    std::int64_t live_ = 0;
};

// A cache that also keeps an fp32 copy of its rows, as kvlab's quantized caches once did, and
// reports only its own storage: the memory checks must see the difference. Base is made with
// (c, args..., memory).
template <class Base>
class WithFp32Copy final : public Base {
public:
    template <class... Args>
    WithFp32Copy(const Config& c, Memory& memory, Args... args)
        : Base(c, args..., memory),
          mirror_(memory, 2 * std::int64_t(c.n_layers) * c.n_kv_heads * c.max_seq * c.head_size()) {}

private:
    Buffer<float> mirror_;  // [2, n_layers, n_kv_heads, max_seq, head_size]
};

// Appends a random number of positions one at a time and writes every layer's rows as the
// decoder does (host writes: a backend would need its own memory); returns how many.
int write_random_positions(Cache& cache) {
    const Config& c = cache.config();
    const int n = draw(0, c.max_seq);
    std::vector<float> k_row(std::size_t(c.kv_dim())), v_row(k_row.size());  // [kv_dim]
    for (int pos = 0; pos < n; pos++) {
        cache.append(draw_tokens(c, 1));
        for (int l = 0; l < c.n_layers; l++) {
            for (float& x : k_row) x = float(draw(-1000, 1000)) / 64.0f;
            for (float& x : v_row) x = float(draw(-1000, 1000)) / 64.0f;
            cache.write(l, pos, k_row.data(), v_row.data());
        }
    }
    return n;
}

// The property over a mismatch function (memory_mismatch, quant_memory_mismatch): "" every case.
void expect_no_mismatch(std::string (*mismatch)(bool mirror), bool mirror) {
    const std::string m = mismatch(mirror);
    if (!m.empty()) RC_FAIL(m);
}

// Fills a cache in `format` with a random number of positions (host writes), then compares what
// it reports with the allocator; "" when they agree. mirror: the counter-test's cache instead.
std::string memory_mismatch(bool mirror) {
    const Config c = draw_config(2);
    const KVFormat format = kKVFormats[std::size_t(draw(0, int(std::size(kKVFormats)) - 1))];
    const std::vector<float> scales =
        kv_format_scaled(int(format)) && draw(0, 1) ? draw_scales(c) : std::vector<float>{};
    CountingMemory memory;
    FormatCache fc;
    if (mirror) {
        fc.cache = std::make_unique<WithFp32Copy<ContiguousCache>>(c, memory, ContiguousCache::Layout::head_major);
        fc.cache->set_kv_format(format, scales);
        fc.name = "a contiguous cache with an fp32 mirror";
    } else {
        fc = format_cache(c, draw(0, 3), format, memory, scales);
    }
    const int n = write_random_positions(*fc.cache);
    // The pool's memory is the blocks of every sequence; a cache's own, its rows alone.
    const MemoryStats ms = fc.pool ? fc.pool->memory() : fc.cache->memory();
    // A row's code bytes and its metadata: a float format's elements; an integer format's groups
    // (the largest divisor of head_size up to 32), codes padded to 4 bytes, an fp32 scale and min.
    const int hs = c.head_size();
    std::int64_t row_codes = std::int64_t(hs) *
                             (format == KVFormat::int8 || format == KVFormat::int4 ? 0 : kv_format_bytes(int(format))),
                 row_meta = 0;
    if (format == KVFormat::int8 || format == KVFormat::int4) {
        int group = std::min(32, hs);
        while (hs % group) group--;
        const int bytes = format == KVFormat::int8 ? hs : (hs + 1) / 2;  // the row's codes, padded to 4
        row_codes = (bytes + 3) / 4 * 4;
        row_meta = std::int64_t(hs / group) * 2 * std::int64_t(sizeof(float));
    }
    const std::int64_t rows = fc.cache->storage().n_rows,
                       scale_bytes = std::int64_t(sizeof(float)) * std::int64_t(scales.size()) + 2 * rows * row_meta;
    const std::string where = fmt::format("{} ({} positions, {}): ", fc.name, n, c.describe());
    if (ms.allocated_bytes != memory.live())
        return where + fmt::format("memory() says {} bytes allocated, the allocator holds {}", ms.allocated_bytes,
                                   memory.live());
    if (ms.reserved_bytes != memory.live())
        return where +
               fmt::format("memory() says {} bytes reserved, the allocator holds {}", ms.reserved_bytes, memory.live());
    if (ms.payload_bytes != 2 * rows * row_codes || ms.metadata_bytes != scale_bytes)
        return where + fmt::format(
                           "payload {} and metadata {} bytes, but {} rows of {} code bytes and {} of group "
                           "scales (K and V) and {} layer scales are {} and {}",
                           ms.payload_bytes, ms.metadata_bytes, rows, row_codes, row_meta, scales.size(),
                           2 * rows * row_codes, scale_bytes);
    if (!fc.pool && ms.used_bytes != kv_bytes(c, n, format))
        return where + fmt::format("used {} bytes, {} positions of {} hold {}", ms.used_bytes, n,
                                   kv_format_name(format), kv_bytes(c, n, format));
    return "";
}

}  // namespace

TEST_CASE("KV formats: the memory a cache reports is the memory its allocator holds: codes and scales, no fp32 copy",
          "[kv-format]") {
    rc::prop("contiguous (both layouts), growing and paged, every format",
             [] { expect_no_mismatch(memory_mismatch, false); });
}

TEST_CASE("KV formats counter-test: a cache that keeps an fp32 copy besides its codes is caught",
          "[kv-format][counter]") {
    test::expect_failure([] { expect_no_mismatch(memory_mismatch, true); }, "the allocator holds");
}

namespace {

// A quantized cache (any bits, key axis and group) filled with a random number of positions; ""
// when the bytes it reports are the bytes its allocator holds.
std::string quant_memory_mismatch(bool mirror) {
    const Config c = draw_config(2);
    const QuantSpec spec = draw_quant_spec(c);
    CountingMemory memory;
    std::unique_ptr<QuantizedCache> cache = mirror ? std::make_unique<WithFp32Copy<QuantizedCache>>(c, memory, spec)
                                                   : std::make_unique<QuantizedCache>(c, spec, memory);
    write_random_positions(*cache);
    const MemoryStats ms = cache->memory();
    const std::string where = fmt::format("{} ({} positions, {}): ", cache->name(), cache->length(), c.describe());
    if (ms.allocated_bytes != memory.live() || ms.reserved_bytes != memory.live())
        return where + fmt::format("memory() says {} bytes allocated and {} reserved, the allocator holds {}",
                                   ms.allocated_bytes, ms.reserved_bytes, memory.live());
    if (ms.scratch_bytes != 0) return where + fmt::format("{} bytes of scratch: an fp32 copy", ms.scratch_bytes);
    return "";
}

}  // namespace

TEST_CASE("quantized cache: the memory it reports is the memory its allocator holds: codes, scales, residual",
          "[kv-format][quant]") {
    rc::prop("int8 and int4, keys per token or per channel, any group, any number of positions written",
             [] { expect_no_mismatch(quant_memory_mismatch, false); });
}

TEST_CASE("quantized cache counter-test: one that keeps an fp32 copy besides its codes is caught",
          "[kv-format][quant][counter]") {
    test::expect_failure([] { expect_no_mismatch(quant_memory_mismatch, true); }, "the allocator holds");
}

TEST_CASE("KV formats: the CPU's row decode gives kv_load's bits for every code, with and without a scale",
          "[kv-format]") {
    for (KVFormat f : kFloatKVFormats) {
        const int bits = 8 * kv_format_bytes(int(f));
        const std::size_t n = std::size_t(1) << bits;
        std::vector<std::uint16_t> wide(n);   // [n] every code once, 16-bit formats
        std::vector<std::uint8_t> narrow(n);  // [n] the same, fp8
        for (std::size_t c = 0; c < n; c++) wide[c] = std::uint16_t(c), narrow[c] = std::uint8_t(c);
        const void* row = bits == 16 ? static_cast<const void*>(wide.data()) : narrow.data();
        // Lengths whose ends fall in each vector width's loop and in the scalar tail.
        for (const std::size_t len : {n, n - 1, n - 9, n - 17})
            for (float scale : {1.0f, 0.3125f, 7.5f}) {
                std::vector<float> got(len);  // [len]
                decode_kv_row(int(f), row, int(len), scale, got.data());
                int wrong = 0;
                for (std::size_t c = 0; c < len; c++) {
                    const float want = kv_load(int(f), row, std::int64_t(c), scale);
                    if (float_bits(got[c]) != float_bits(want) && wrong++ < 5)
                        FAIL_CHECK(fmt::format("{} code 0x{:x}, scale {}: decode_kv_row 0x{:08x}, kv_load 0x{:08x}",
                                               kv_format_name(f), c, scale, float_bits(got[c]), float_bits(want)));
                }
                CHECK(wrong == 0);
            }
    }
}

TEST_CASE("KV formats: the CPU's row decode of an integer row gives kv_load's bits, every group, any bytes",
          "[kv-format]") {
    rc::prop("int8 and int4 rows of head_size 1..96 holding random bytes (any scale, minimum and code)", [] {
        const KVFormat f = draw(0, 1) ? KVFormat::int8 : KVFormat::int4;
        const int hs = draw(1, 96), group = kv_int_group(hs);
        std::vector<std::uint32_t> words(static_cast<std::size_t>(kv_row_bytes(int(f), hs) / 4));  // [row_bytes / 4]
        for (std::uint32_t& w : words) w = *rc::gen::arbitrary<std::uint32_t>();
        std::vector<float> got(static_cast<std::size_t>(hs));  // [head_size]
        decode_kv_row(int(f), words.data(), hs, 1.0f, got.data(), group);
        for (int d = 0; d < hs; d++) {
            const float want = kv_load(int(f), words.data(), d, 1.0f, group, hs);
            RC_ASSERT(float_bits(got[std::size_t(d)]) == float_bits(want));
        }
    });
}

namespace {

using DecodeRows = std::function<void(int, const void*, std::int64_t, int, int, float, float*, int)>;

// Draws a format (every narrow one), head_size 1..96 (or 97..299), 1..9 rows of random bytes stored
// row_bytes apart (the format's row, or that plus padding) and a scale, decodes them with
// `decode`, and returns the first element that is not kv_load's bits, or "".
std::string decode_rows_mismatch(const DecodeRows& decode) {
    const KVFormat f = kKVFormats[std::size_t(*rc::gen::inRange(1, int(std::size(kKVFormats))))];
    // (past 256 elements or 8 groups an integer row takes the group-by-group loop)
    const int hs = *rc::gen::inRange(0, 8) == 0 ? *rc::gen::inRange(97, 300) : *rc::gen::inRange(1, 97);
    const int n_rows = *rc::gen::inRange(1, 10);
    const int group = kv_format_int(int(f)) ? kv_int_group(hs) : 0;
    const std::int64_t row_bytes = kv_row_bytes(int(f), hs, group) + 4 * *rc::gen::element(0, 0, 1, 3);
    const float scale = *rc::gen::element(1.0f, 0.3125f, 7.5f, 0x1p-130f);
    std::vector<std::uint32_t> words(std::size_t(n_rows * row_bytes / 4 + 1));  // [n_rows * row_bytes / 4 + 1]
    for (std::uint32_t& w : words) w = *rc::gen::arbitrary<std::uint32_t>();
    std::vector<float> got(std::size_t(n_rows) * hs);  // [n_rows, head_size]
    decode(int(f), words.data(), row_bytes, n_rows, hs, scale, got.data(), group);
    for (int i = 0; i < n_rows; i++) {
        const auto* row = reinterpret_cast<const char*>(words.data()) + i * row_bytes;
        for (int d = 0; d < hs; d++) {
            const float want = kv_load(int(f), row, d, scale, group, hs), g = got[std::size_t(i) * hs + d];
            if (float_bits(g) != float_bits(want))
                return fmt::format(
                    "{} head_size {} row {} of {} ({} bytes apart) element {}: 0x{:08x}, kv_load 0x{:08x}",
                    kv_format_name(f), hs, i, n_rows, row_bytes, d, float_bits(g), float_bits(want));
        }
    }
    return "";
}

}  // namespace

TEST_CASE("KV formats: the CPU's block decode (eight adjacent rows at once) gives kv_load's bits, padded rows too",
          "[kv-format]") {
    rc::prop("every narrow format, head_size 1..299, 1..9 rows of random bytes, any scale",
             [] { RC_ASSERT(decode_rows_mismatch(decode_kv_rows) == ""); });
}

TEST_CASE("KV formats counter-test: a block decode that takes rows to be packed is caught when they are padded",
          "[kv-format][counter]") {
    test::expect_failure(
        [] {
            RC_ASSERT(decode_rows_mismatch([](int format, const void* src, std::int64_t row_bytes, int n_rows, int n,
                                              float scale, float* dst, int group) {
                          const std::int64_t packed = kv_row_bytes(format, n, group);  // ignores row_bytes
                          (void)row_bytes;
                          for (int i = 0; i < n_rows; i++)
                              decode_kv_row(format, static_cast<const char*>(src) + i * packed, n, scale,
                                            dst + std::int64_t(i) * n, group);
                      }) == "");
        },
        "kv_load");
}

TEST_CASE(
    "KV formats: scales calibrated from a prompt store its largest |K| and |V| of each layer at the format's "
    "largest finite code, and nothing past it",
    "[kv-format]") {
    rc::prop("random models and prompts, fp8-e5m2 and fp8-e4m3", [] {
        const Config c = draw_config(2);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const KVFormat format = kKVFormats[std::size_t(draw(3, 4))];
        const std::vector<int> tokens = draw_tokens(c, draw(1, c.max_seq));
        const std::vector<float> scales = calibrate_kv_scales(m, tokens, format);
        RC_ASSERT(scales.size() == std::size_t(2 * c.n_layers));
        ContiguousCache cache(c);
        CachedDecoder(m, cache).prefill(tokens);
        const FloatFormat f = float_format(int(format));
        for (int l = 0; l < c.n_layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                const float s = scales[std::size_t(2 * l + kv)];
                RC_ASSERT(std::isfinite(s) && s > 0.0f);
                std::uint32_t top = 0;
                for (int t = 0; t < cache.length(); t++)
                    for (int h = 0; h < c.n_kv_heads; h++)
                        for (int d = 0; d < c.head_size(); d++) {
                            const float x = (kv ? cache.value(l, h, t) : cache.key(l, h, t))[d];
                            // Within the range: x / s at most the largest finite value (one rounding off).
                            RC_ASSERT(std::fabs(x / s) <= decode_float(f, f.max_finite()) * (1.0f + 0x1p-20f));
                            top = std::max(top, encode_float(f, x / s) & (f.sign_bit() - 1));
                        }
                if (s != 1.0f) RC_ASSERT(top == f.max_finite());  // the largest value uses the whole range
            }
    });
    const Config c =
        Config::parse("dim=8,hidden_dim=8,n_layers=1,n_heads=2,n_kv_heads=1,vocab_size=16,max_seq=8", Config{});
    CHECK_THROWS_WITH(calibrate_kv_scales(random_model(c, 1), std::vector<int>{1}, KVFormat::bf16),
                      Catch::Contains("bf16 takes no scale"));
}

// ----------------------------------------------------------------------------------------------
// Integer formats at their rounding rule's ties (NUMERICS.md: code = round((x - min) / scale), half
// away from zero, clamped). Random inputs never land on a tie, so a rule that rounds ties another
// way passes every other test: these rows are built so that most elements are exact ties.

namespace {

using Encode = std::function<unsigned(float, QuantRange, int)>;

// The rule, written another way: the quotient as NUMERICS.md states it (two IEEE operations),
// then the nearest integer in double, half away from zero (q >= 0 here), clamped.
unsigned oracle_code(float x, QuantRange r, int bits) {
    if (r.scale == 0.0f) return 0;
    const float q = (x - r.min) / r.scale;
    if (!(q > 0.0f)) return 0;
    return unsigned(std::min(std::floor(double(q) + 0.5), double((1u << bits) - 1)));
}

// A group of n values whose range fits exactly: min m and scale 2^e (so max = m + levels * 2^e is
// exact and the fitted scale is 2^e again), elements min, max, and k + 1/2 or k steps above min
// (an exact tie for most), m any multiple of 2^(e - 1) of either sign.
std::vector<float> draw_tie_group(int bits, int n) {
    const int levels = (1 << bits) - 1, e = draw(-20, 10);
    const float step = std::ldexp(1.0f, e), m = float(draw(-4000, 4000)) * step / 2;
    std::vector<float> x(std::size_t(std::max(n, 2)));  // [n] (at least min and max)
    x[0] = m, x[1] = m + float(levels) * step;
    for (std::size_t i = 2; i < x.size(); i++)
        x[i] = m + (float(draw(0, levels - 1)) + (draw(0, 3) > 0 ? 0.5f : 0.0f)) * step;
    std::vector<int> order(x.size());
    for (std::size_t i = 0; i < order.size(); i++) order[i] = int(i);
    for (std::size_t i = order.size(); i > 1; i--) std::swap(order[i - 1], order[std::size_t(draw(0, int(i) - 1))]);
    std::vector<float> shuffled(x.size());
    for (std::size_t i = 0; i < x.size(); i++) shuffled[i] = x[std::size_t(order[i])];
    return shuffled;
}

// Every element of drawn tie groups encodes to the oracle's code under `encode`.
void tie_property(const Encode& encode) {
    const int bits = draw(0, 1) ? 8 : 4;
    const std::vector<float> x = draw_tie_group(bits, draw(2, 40));
    const QuantRange r = quant_fit(x.data(), int(x.size()), 1, bits);
    for (float xi : x) {
        const unsigned got = encode(xi, r, bits), want = oracle_code(xi, r, bits);
        if (got != want)
            fail(fmt::format("int{}: x = {} (min {}, scale {}, (x - min) / scale = {}): code {}, the rule gives {}",
                             bits, xi, r.min, r.scale, (xi - r.min) / r.scale, got, want));
    }
}

}  // namespace

TEST_CASE("integer formats: codes follow the rounding rule at exact ties (half away from zero), and elsewhere",
          "[kv-format]") {
    rc::prop("groups of 2-40 values at exact ties, any power-of-two scale and minimum",
             [] { tie_property([](float x, QuantRange r, int bits) { return quant_encode(x, r, bits); }); });
}

TEST_CASE("integer formats counter-test: an encoder that rounds ties down (or to even) is caught",
          "[kv-format][counter]") {
    test::expect_failure(
        [] {
            tie_property([](float x, QuantRange r, int bits) {
                const unsigned c = quant_encode(x, r, bits);
                const float q = (x - r.min) / r.scale;
                return r.scale != 0.0f && c > 0 && float(c) - q == 0.5f ? c - 1 : c;  // a tie rounded down
            });
        },
        "the rule gives");
    test::expect_failure(
        [] {
            tie_property([](float x, QuantRange r, int bits) {
                const float q = r.scale == 0.0f ? 0.0f : (x - r.min) / r.scale;
                return unsigned(std::clamp(std::nearbyint(q), 0.0f, float((1 << bits) - 1)));  // ties to even
            });
        },
        "the rule gives");
}

TEST_CASE("integer formats: a stored row reads back each element's code at the rule's ties, int8 and int4",
          "[kv-format]") {
    rc::prop("rows of 1-4 tie groups, stored through kv_store_element and read through kv_load", [] {
        const KVFormat f = draw(0, 1) ? KVFormat::int8 : KVFormat::int4;
        const int bits = kv_int_bits(int(f)), group = draw(2, 12), n_groups = draw(1, 4), hs = group * n_groups;
        std::vector<float> x;  // [head_size] n_groups tie groups
        for (int g = 0; g < n_groups; g++) {
            const std::vector<float> part = draw_tie_group(bits, group);
            x.insert(x.end(), part.begin(), part.end());
        }
        std::vector<std::uint32_t> row(std::size_t(kv_row_bytes(int(f), hs, group) / 4 + 1));  // [row_bytes / 4]
        for (int d = 0; d < hs; d++) kv_store_element(int(f), row.data(), d, x.data(), 1.0f, group, hs);
        for (int d = 0; d < hs; d++) {
            const QuantRange r = quant_fit(x.data() + d / group * group, group, 1, bits);
            const float want = quant_decode(oracle_code(x[std::size_t(d)], r, bits), r),
                        got = kv_load(int(f), row.data(), d, 1.0f, group, hs);
            RC_ASSERT(float_bits(got) == float_bits(want));
        }
    });
}
