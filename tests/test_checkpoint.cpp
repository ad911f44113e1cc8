// Checkpoint I/O: bit-exact round trips, the documented byte layouts (written here by hand, index
// by index, independently of core/checkpoint.cpp), every malformed-file error, and the real
// stories260K checkpoint.
#include <fmt/format.h>
#include <rapidcheck/catch.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "test_util.h"

// Largest single allocation since the last reset: lets the error tests prove that a header claiming
// billions of parameters is rejected without trying to allocate them. Every unaligned form is
// replaced so that new and delete always pair malloc with free (ASan checks the pairing).
static std::atomic<std::size_t> g_largest_alloc{0};

static void* tracked_malloc(std::size_t n) noexcept {
    std::size_t seen = g_largest_alloc.load(std::memory_order_relaxed);
    while (n > seen && !g_largest_alloc.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
    return std::malloc(n ? n : 1);
}

// noinline: inlined into callers, the malloc/free pair looks mismatched to -Wmismatched-new-delete.
[[gnu::noinline]] void* operator new(std::size_t n) {
    if (void* p = tracked_malloc(n)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t n) {
    if (void* p = tracked_malloc(n)) return p;
    throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return tracked_malloc(n); }
[[gnu::noinline]] void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return tracked_malloc(n); }
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

using test::TempFile;

Bytes read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    REQUIRE(out);
}

void put(Bytes& b, const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    b.insert(b.end(), c, c + n);
}
void put_i32(Bytes& b, std::int32_t v) { put(b, &v, 4); }
void put_f32(Bytes& b, float v) { put(b, &v, 4); }
void put_all(Bytes& b, std::span<const float> t) { put(b, t.data(), t.size() * 4); }

// Writes a matrix [L][out][in] (Weights' layout) as the file's [L][out][in], element by element
// from its indices, so the test does not lean on the two layouts being the same bytes.
void put_matrix(Bytes& b, std::span<const float> ours, int L, int in, int out) {
    for (int l = 0; l < L; l++)
        for (int o = 0; o < out; o++)
            for (int i = 0; i < in; i++) put_f32(b, ours[(std::size_t(l) * out + o) * in + i]);
}

void put_params(Bytes& b, const Config& c, std::int32_t vocab_field) {
    for (std::int32_t v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab_field, c.max_seq})
        put_i32(b, v);
}

// The legacy layout, straight from llama2.c's export.py legacy_export.
Bytes legacy_bytes(const Model& m) {
    const Weights& w = m.w;
    const Config& c = w.config;
    const int L = c.n_layers, dim = c.dim, kv = c.kv_dim(), hid = c.hidden_dim;
    Bytes b;
    put_params(b, c, w.shared_classifier ? c.vocab_size : -c.vocab_size);
    put_all(b, w.token_embedding);
    put_all(b, w.rms_att);
    put_matrix(b, w.wq, L, dim, dim);
    put_matrix(b, w.wk, L, dim, kv);
    put_matrix(b, w.wv, L, dim, kv);
    put_matrix(b, w.wo, L, dim, dim);
    put_all(b, w.rms_ffn);
    put_matrix(b, w.w1, L, dim, hid);
    put_matrix(b, w.w2, L, hid, dim);
    put_matrix(b, w.w3, L, dim, hid);
    put_all(b, w.rms_final);
    put_all(b, m.rope.cos);
    put_all(b, m.rope.sin);
    if (!w.shared_classifier) put_matrix(b, w.wcls, 1, dim, c.vocab_size);
    return b;
}

// The "ak42" version-1 layout, straight from llama2.c's export.py version1_export.
Bytes v1_bytes(const Weights& w, std::int32_t version = 1) {
    const Config& c = w.config;
    const int L = c.n_layers, dim = c.dim, kv = c.kv_dim(), hid = c.hidden_dim;
    Bytes b;
    const std::uint32_t magic = 0x616b3432;
    put(b, &magic, 4);
    put_i32(b, version);
    put_params(b, c, c.vocab_size);
    b.push_back(w.shared_classifier ? 1 : 0);
    b.resize(256, 0);
    put_all(b, w.rms_att);
    put_all(b, w.rms_ffn);
    put_all(b, w.rms_final);
    put_all(b, w.token_embedding);
    put_matrix(b, w.wq, L, dim, dim);
    put_matrix(b, w.wk, L, dim, kv);
    put_matrix(b, w.wv, L, dim, kv);
    put_matrix(b, w.wo, L, dim, dim);
    put_matrix(b, w.w1, L, dim, hid);
    put_matrix(b, w.w2, L, hid, dim);
    put_matrix(b, w.w3, L, dim, hid);
    if (!w.shared_classifier) put_matrix(b, w.wcls, 1, dim, c.vocab_size);
    return b;
}

// "" when a and b are the same model bit for bit, else what differs first.
std::string weight_diff(const Weights& a, const Weights& b) {
    if (!(a.config == b.config)) return "config: " + a.config.describe() + " vs " + b.config.describe();
    if (a.shared_classifier != b.shared_classifier) return "shared_classifier";
    const std::pair<const char*, std::span<float> Weights::*> tensors[] = {
        {"token_embedding", &Weights::token_embedding},
        {"rms_att", &Weights::rms_att},
        {"wq", &Weights::wq},
        {"wk", &Weights::wk},
        {"wv", &Weights::wv},
        {"wo", &Weights::wo},
        {"rms_ffn", &Weights::rms_ffn},
        {"w1", &Weights::w1},
        {"w2", &Weights::w2},
        {"w3", &Weights::w3},
        {"rms_final", &Weights::rms_final},
        {"wcls", &Weights::wcls},
    };
    for (auto [name, member] : tensors) {
        const auto &x = a.*member, &y = b.*member;
        if (x.size() != y.size()) return fmt::format("{}: size {} vs {}", name, x.size(), y.size());
        if (std::memcmp(x.data(), y.data(), x.size() * 4) != 0) return fmt::format("{}: contents differ", name);
    }
    if (a.fingerprint() != b.fingerprint()) return "fingerprint";
    return "";
}

// The load error's message, or "<no error>"; exceptions other than kvlab::Error escape and fail the test.
std::string load_error(const std::string& path, std::size_t* largest_alloc = nullptr) {
    g_largest_alloc = 0;
    std::string msg = "<no error>";
    try {
        (void)load_checkpoint(path);
    } catch (const Error& e) {
        if (largest_alloc) *largest_alloc = g_largest_alloc;
        msg = e.what();
    }
    return msg;
}

// Loading `path` must fail with one line that names the file and the problem, allocating nothing big.
void check_load_error(const std::string& path, const std::string& problem) {
    std::size_t largest = 0;
    const std::string msg = load_error(path, &largest);
    INFO("message: " << msg);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK_THAT(msg, Catch::Contains(problem));
    CHECK_THAT(msg, Catch::Contains(path));
    CHECK(largest < (std::size_t{1} << 20));
}

Bytes header(std::int32_t dim, std::int32_t hidden, std::int32_t layers, std::int32_t heads, std::int32_t kv_heads,
             std::int32_t vocab, std::int32_t seq) {
    Bytes b;
    for (std::int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq}) put_i32(b, v);
    return b;
}

// A small model with every size distinct, so a swapped dimension cannot go unnoticed.
const Config kSmall{/*dim*/ 8,     /*hidden_dim*/ 12, /*n_layers*/ 2,
                    /*n_heads*/ 2, /*n_kv_heads*/ 1,  /*vocab_size*/ 10,
                    /*max_seq*/ 6};

Config gen_config() {
    const int head_size = *test::full_range(1, 17);
    const int n_heads = *test::full_range(1, 9);
    Config c;
    c.dim = n_heads * head_size;
    c.n_heads = n_heads;
    c.n_kv_heads = *proofs::gen_n_kv_heads(n_heads);
    c.n_layers = *test::full_range(1, 4);
    c.hidden_dim = *test::full_range(1, 41);
    c.vocab_size = *test::full_range(1, 65);
    c.max_seq = *test::full_range(1, 33);
    return c;
}

}  // namespace

TEST_CASE("save then load is the identity, bit for bit, and both layouts match llama2.c's export.py", "[checkpoint]") {
    rc::prop("random small models, shared and separate classifier", [] {
        const Config c = gen_config();
        const bool shared = *rc::gen::arbitrary<bool>();
        const auto seed = *rc::gen::arbitrary<std::uint64_t>();
        const Model m = random_model(c, seed, shared);
        RC_TAG(shared ? "shared" : "separate");

        TempFile legacy;
        save_checkpoint(legacy.path(), m);
        // save writes exactly export.py's legacy layout...
        RC_ASSERT(read_bytes(legacy.path()) == legacy_bytes(m));
        // ...and load undoes it exactly.
        const Model back = load_checkpoint(legacy.path());
        RC_ASSERT(weight_diff(m.w, back.w) == std::string());
        RC_ASSERT(back.w.fingerprint() == m.w.fingerprint());

        // The ak42 version-1 layout of the same weights loads to the same model.
        TempFile v1;
        write_bytes(v1.path(), v1_bytes(m.w));
        const Model from_v1 = load_checkpoint(v1.path());
        RC_ASSERT(weight_diff(back.w, from_v1.w) == std::string());
    });
}

TEST_CASE("a version-1 file written by hand loads to the same weights as the legacy one", "[checkpoint]") {
    for (bool shared : {true, false}) {
        INFO("shared classifier: " << shared);
        const Model m = random_model(kSmall, 42, shared);
        TempFile legacy, v1;
        write_bytes(legacy.path(), legacy_bytes(m));
        write_bytes(v1.path(), v1_bytes(m.w));
        CHECK(read_bytes(v1.path()).size() == 256 + 4 * std::size_t(kSmall.n_params(shared)));
        const Model a = load_checkpoint(legacy.path()), b = load_checkpoint(v1.path());
        CHECK(weight_diff(a.w, b.w) == "");
        CHECK(weight_diff(m.w, a.w) == "");
        CHECK(a.w.fingerprint() == m.w.fingerprint());
    }
}

TEST_CASE("the saved file has the size the legacy format implies", "[checkpoint]") {
    // kSmall: dim 8, hidden 12, 2 layers, 2 heads (head_size 4), 1 KV head (kv_dim 4), vocab 10, max_seq 6.
    const std::int64_t floats = 10 * 8              // token_embedding [vocab, dim]
                                + 2 * 8             // rms_att [L, dim]
                                + 2 * 8 * 8         // wq [L, dim, dim]
                                + 2 * 4 * 8 * 2     // wk, wv [L, kv_dim, dim]
                                + 2 * 8 * 8         // wo [L, dim, dim]
                                + 2 * 8             // rms_ffn [L, dim]
                                + 3 * 2 * 12 * 8    // w1, w2, w3 [L, hidden, dim] (w2 transposed, same count)
                                + 8                 // rms_final [dim]
                                + 2 * 6 * (4 / 2);  // freq_cis_real, freq_cis_imag [max_seq, head_size/2]
    REQUIRE(floats == 1104);
    TempFile f;
    save_checkpoint(f.path(), random_model(kSmall, 1, true));
    CHECK(fs::file_size(f.path()) == 28 + 4 * floats);  // 4444
    save_checkpoint(f.path(), random_model(kSmall, 1, false));
    CHECK(fs::file_size(f.path()) == 28 + 4 * (floats + 10 * 8));  // plus the classifier [vocab, dim]: 4764
}

TEST_CASE("malformed files are one-line kvlab::Errors naming the file and the problem", "[checkpoint]") {
    const Model m = random_model(kSmall, 7, true);
    const Bytes good = legacy_bytes(m);  // 4444 bytes
    REQUIRE(good.size() == 4444);
    TempFile f;
    auto with = [&f](const Bytes& b) -> const std::string& {
        write_bytes(f.path(), b);
        return f.path();
    };

    SECTION("missing file") { check_load_error(f.path() + ".missing", "file not found"); }
    SECTION("a directory") { check_load_error(fs::temp_directory_path().string(), "not a regular file"); }
    SECTION("empty file") { check_load_error(with({}), "is shorter than the 28-byte llama2.c header (0 bytes)"); }
    SECTION("part of a header") {
        check_load_error(with(Bytes(good.begin(), good.begin() + 27)),
                         "shorter than the 28-byte llama2.c header (27 bytes)");
    }
    SECTION("header only") {
        check_load_error(with(Bytes(good.begin(), good.begin() + 28)), "truncated: expected 4444 bytes, found 28");
    }
    SECTION("truncated by one byte") {
        check_load_error(with(Bytes(good.begin(), good.end() - 1)), "truncated: expected 4444 bytes, found 4443");
    }
    SECTION("one trailing byte") {
        Bytes b = good;
        b.push_back(0);
        check_load_error(with(b), "has 1 trailing byte: expected 4444 bytes, found 4445");
    }
    SECTION("a negative vocab_size announces a classifier that is not there") {
        Bytes b = good;
        const std::int32_t vocab = -10;
        std::memcpy(b.data() + 20, &vocab, 4);
        check_load_error(with(b), "truncated: expected 4764 bytes, found 4444");
    }
    SECTION("dim = 0") { check_load_error(with(header(0, 12, 2, 2, 1, 10, 6)), "dim must be positive, got 0"); }
    SECTION("negative n_layers") {
        check_load_error(with(header(8, 12, -1, 2, 1, 10, 6)), "n_layers must be positive, got -1");
    }
    SECTION("n_heads does not divide dim") {
        check_load_error(with(header(64, 12, 2, 3, 1, 10, 6)), "n_heads (3) must divide dim (64)");
    }
    SECTION("n_kv_heads does not divide n_heads") {
        check_load_error(with(header(64, 12, 2, 8, 3, 10, 6)), "n_kv_heads (3) must divide n_heads (8)");
    }
    SECTION("sizes whose products overflow") {
        const int big = 1 << 30;
        check_load_error(with(header(big, big, big, 1, 1, big, big)), "too large");
    }
    SECTION("vocab_size INT_MIN has no absolute value") {
        check_load_error(with(header(8, 12, 2, 2, 1, INT_MIN, 6)), "vocab_size -2147483648 is out of range");
    }
    SECTION("a valid Llama-2-7B-sized header on a tiny file is not allocated") {
        // 6.6e9 parameters: within kMaxElements, so only the size check stands between it and 26 GB.
        check_load_error(with(header(4096, 11008, 32, 32, 32, 32000, 4096)),
                         "truncated: expected 26431471644 bytes, found 28");
    }
    SECTION("ak42 version 2 (int8)") {
        check_load_error(with(v1_bytes(m.w, 2)), "version 2 (int8) checkpoints are not supported");
    }
    SECTION("ak42 unknown version") { check_load_error(with(v1_bytes(m.w, 7)), "ak42 version 7 is not supported"); }
    SECTION("ak42 header cut short") {
        const Bytes v1 = v1_bytes(m.w);
        check_load_error(with(Bytes(v1.begin(), v1.begin() + 100)),
                         "shorter than the 256-byte ak42 header (100 bytes)");
    }
    SECTION("ak42 truncated by one byte") {
        const Bytes v1 = v1_bytes(m.w);
        check_load_error(with(Bytes(v1.begin(), v1.end() - 1)),
                         fmt::format("truncated: expected {} bytes, found {}", v1.size(), v1.size() - 1));
    }
    SECTION("ak42 bad shared_classifier flag") {
        Bytes v1 = v1_bytes(m.w);
        v1[36] = 2;
        check_load_error(with(v1), "shared_classifier flag is 2, expected 0 or 1");
    }
    SECTION("ak42 negative vocab_size") {
        Bytes v1 = v1_bytes(m.w);
        const std::int32_t vocab = -10;
        std::memcpy(v1.data() + 8 + 20, &vocab, 4);
        check_load_error(with(v1), "vocab_size must be positive, got -10");
    }
}

TEST_CASE("save refuses what it cannot write faithfully", "[checkpoint]") {
    TempFile f;
    SECTION("unwritable path") {
        const std::string path = f.path() + ".missing-dir/model.bin";
        try {
            save_checkpoint(path, random_model(kSmall, 3));
            FAIL("no error");
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("' does not exist"));
        }
    }
    SECTION("a shared classifier that is not the embedding's own floats would be lost") {
        Model m = random_model(kSmall, 3, true);
        std::vector<float> elsewhere(m.w.wcls.begin(), m.w.wcls.end());  // [vocab_size, dim]
        m.w.wcls = elsewhere;
        try {
            save_checkpoint(f.path(), m);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK_THAT(e.what(), Catch::Contains("the classifier of a shared model is not its token embedding"));
        }
    }
}

TEST_CASE("stories260K loads, and saving it reproduces the file", "[stories260k]") {
    KVLAB_MODEL_FILE_OR_SKIP(path, "stories260K.bin");

    const Model m = load_checkpoint(path);
    const Config c = m.config();
    CHECK(c == Config{64, 172, 5, 8, 4, 512, 512});
    CHECK(c == stories260k_shape());
    CHECK(m.w.shared_classifier);

    TempFile f;
    save_checkpoint(f.path(), m);
    const Bytes orig = read_bytes(path), ours = read_bytes(f.path());
    REQUIRE(orig.size() == ours.size());
    REQUIRE(orig.size() == 1056540);

    // Everything but the RoPE tables must be byte-identical: header, weights, (no) classifier.
    const std::size_t rope_begin = 28 + 4 * std::size_t(c.n_params(true));
    const std::size_t rope_floats = 2 * std::size_t(c.max_seq) * (c.head_size() / 2);
    const std::size_t rope_end = rope_begin + 4 * rope_floats;
    REQUIRE(rope_end == orig.size());
    CHECK(std::memcmp(orig.data(), ours.data(), rope_begin) == 0);
    CHECK(std::memcmp(orig.data() + rope_end, ours.data() + rope_end, orig.size() - rope_end) == 0);

    // The tables were computed by PyTorch in float32, ours by RopeTable: allow at most 1 ulp.
    std::size_t differ = 0;
    std::int64_t worst = 0;
    for (std::size_t k = 0; k < rope_floats; k++) {
        float a, b;
        std::memcpy(&a, orig.data() + rope_begin + 4 * k, 4);
        std::memcpy(&b, ours.data() + rope_begin + 4 * k, 4);
        const std::int64_t d = std::int64_t(ulp_distance(a, b));
        differ += d != 0;
        worst = std::max(worst, d);
    }
    std::printf("stories260K RoPE tables: %zu of %zu floats differ from llama2.c's, by at most %lld ulp\n", differ,
                rope_floats, static_cast<long long>(worst));
    CHECK(worst <= 1);

    // And what we wrote loads back to the same model.
    CHECK(weight_diff(m.w, load_checkpoint(f.path()).w) == "");
}
