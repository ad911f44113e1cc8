// Helpers shared by kvlab's tests: generators (proofs/generators.h, shared with the verification
// suite), bitwise comparison with a readable report (core/compare.h), properties that must fail,
// temporary files, and the skip convention for data that may be absent.
#pragma once

#include <fmt/format.h>
#include <rapidcheck.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cache.h"
#include "compare.h"
#include "config.h"
#include "generators.h"
#include "models_dir.h"
#include "numerics.h"

namespace kvlab {
// How RapidCheck prints a Config in a counterexample.
inline void showValue(const Config& c, std::ostream& os) { os << c.describe(); }
}  // namespace kvlab

namespace kvlab::test {

// The K and V rows (host pointers into the cache's storage) that a query at pos reads at layer
// l, KV head h: the slots cache.attended() lists, resolved as the kernels resolve them (a slot
// of -1 reads a NaN row). Returns how many. fp32 storage only (KVStorage::k_f32 throws otherwise).
inline int attended_rows(const Cache& cache, int l, int h, int pos, std::vector<const float*>& keys,
                         std::vector<const float*>& values) {
    static const std::vector<float> nan_row(4096, kNaN);
    const KVStorage& st = cache.storage();
    const int hs = cache.config().head_size();
    std::vector<std::int64_t> slots(std::size_t(pos) + 1, -1);  // [pos + 1]: no variant attends more
    const int n = cache.attended(pos, slots.data());
    keys.resize(std::size_t(n));
    values.resize(std::size_t(n));
    for (int i = 0; i < n; i++) {
        const std::int64_t s = slots[std::size_t(i)];
        keys[std::size_t(i)] = s < 0 ? nan_row.data() : st.k_f32() + st.row(l, h, s) * hs;
        values[std::size_t(i)] = s < 0 ? nan_row.data() : st.v_f32() + st.row(l, h, s) * hs;
    }
    return n;
}

// What llama2.c's own test (test_all.py, test_runc) records for `run stories260K.bin -z tok512.bin
// -t 0.0 -n 200`: 200 greedy steps from BOS.
inline const char* const kLlama2cExpected =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the "
    "park.\" Lily was sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find "
    "it.\"\nLily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily "
    "didn't want to help her mom, so she";

// The path of a file in the shared models folder, or "" when it is absent. Absent under ctest
// (which runs one test per process, with a filter) ends the process with 77, which ctest reports
// as skipped; in a whole-binary run the caller returns instead, so other results still count.
inline std::string model_file(const std::string& name) {
    const std::string dir = models_dir();
    const std::string path = dir.empty() ? "../shared/models/" + name : (std::filesystem::path(dir) / name).string();
    if (!dir.empty() && std::filesystem::exists(path)) return path;
    std::printf("SKIPPED: %s not found (set KVLAB_MODELS_DIR to the folder holding it)\n", path.c_str());
    std::fflush(stdout);
    if (Catch::getCurrentContext().getConfig()->hasTestFilters()) std::exit(77);
    return "";
}
#define KVLAB_MODEL_FILE_OR_SKIP(var, name)                \
    const std::string var = kvlab::test::model_file(name); \
    if (var.empty()) return

// The seed of a test that runs kvlab's own property checks (verify, verify_plugin): drawn per
// run, so that runs together cover more than one seed's cases, or KVLAB_TEST_SEED's to replay
// one. The test names it in every failure (INFO).
inline std::uint64_t run_seed() {
    if (const char* s = std::getenv("KVLAB_TEST_SEED"); s && *s) return std::strtoull(s, nullptr, 10);
    static std::atomic<std::uint64_t> drawn{std::uint64_t(::getpid()) * 0x9E3779B97F4A7C15ull ^
                                            std::uint64_t(::time(nullptr))};
    return drawn.fetch_add(0x9E3779B97F4A7C15ull) % 1000000007ull;
}

// Runs a property that must fail (a planted bug, a wrong expectation) with a fixed seed, so a
// printed counterexample can be replayed. Returns RapidCheck's failure; an empty optional means
// the property held, which the caller reports as a test failure.
inline std::optional<rc::detail::FailureResult> run_to_failure(const std::function<void()>& property,
                                                               std::uint64_t seed = 20261121, int max_success = 100) {
    rc::detail::TestParams params;
    params.seed = seed;
    params.maxSuccess = max_success;
    rc::detail::FailureResult failure;
    if (!rc::detail::checkTestable(property, rc::detail::TestMetadata{}, params).match(failure)) return std::nullopt;
    return failure;
}

// A counterexample's generated values, one per line.
inline std::string counterexample_text(const rc::detail::FailureResult& f, const char* separator = " = ") {
    std::string example;
    for (const auto& [type, value] : f.counterExample) example += type + separator + value + "\n";
    return example;
}

// Runs a property that must fail (run_to_failure's fixed seed) and checks that RapidCheck's
// failure message contains `expected`; returns the failure for further checks.
inline rc::detail::FailureResult expect_failure(const std::function<void()>& property, const std::string& expected) {
    const auto failure = run_to_failure(property);
    REQUIRE(failure);
    INFO("shrunk counterexample:\n" << counterexample_text(*failure) << failure->description);
    CHECK(failure->description.find(expected) != std::string::npos);
    return *failure;
}

// A file name under the system temp folder, unique to this process and object, removed when it
// goes out of scope. Constructed with bytes, the file holds them.
class TempFile {
public:
    TempFile() {
        static std::atomic<int> counter{0};
        path_ = (std::filesystem::temp_directory_path() / fmt::format("kvlab_test_{}_{}.bin", ::getpid(), counter++))
                    .string();
    }
    explicit TempFile(const std::string& bytes) : TempFile() {
        std::ofstream f(path_, std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        REQUIRE(f.good());
    }
    ~TempFile() {
        std::error_code ec;
        std::filesystem::remove(path_, ec);
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// The tiny configs the properties range over: 1-4 layers, 1-8 heads, n_kv_heads any divisor
// of n_heads, head_size 1-32, hidden_dim 1-64, vocab 1-300, max_seq 1-64, every range drawn
// whole in every case (generators.h).
using proofs::full_range;
using proofs::kFullSize;

inline rc::Gen<Config> gen_tiny_config(int max_head_size = 32, int max_seq = 64) {
    return rc::gen::resize(kFullSize, rc::gen::exec([=] {
                               Config c;
                               c.n_layers = *rc::gen::inRange(1, 5);
                               c.n_heads = *rc::gen::inRange(1, 9);
                               c.n_kv_heads = *proofs::gen_n_kv_heads(c.n_heads);
                               c.dim = c.n_heads * *rc::gen::inRange(1, max_head_size + 1);
                               c.hidden_dim = *rc::gen::inRange(1, 65);
                               c.vocab_size = *rc::gen::inRange(1, 301);
                               c.max_seq = *rc::gen::inRange(1, max_seq + 1);
                               return c;
                           }));
}

// A sequence of 1..max_seq token ids below vocab_size.
inline std::vector<int> gen_tokens(const Config& c, int min_len = 1) {
    const int n = *rc::gen::resize(kFullSize, rc::gen::inRange(min_len, c.max_seq + 1));
    return *rc::gen::resize(kFullSize,
                            rc::gen::container<std::vector<int>>(std::size_t(n), rc::gen::inRange(0, c.vocab_size)));
}

// One generated run of a decoder: a tiny config, a model seed, the tokens, and how many of them
// are prefilled before the rest are decoded one at a time.
struct DecodeCase {
    Config config;
    std::uint64_t seed = 0;
    std::vector<int> tokens;
    int prompt_len = 0;
};
inline DecodeCase gen_decode_case() {
    DecodeCase k;
    k.config = *gen_tiny_config();
    k.seed = *rc::gen::arbitrary<std::uint64_t>();
    k.tokens = gen_tokens(k.config);
    k.prompt_len = *rc::gen::inRange(1, int(k.tokens.size()) + 1);
    return k;
}

// A planted product kernel (run by planted.h's ProductBackend): each element summed as two halves
// of k added at the end, a split-K kernel. Every element is a real-number-correct dot product,
// and the bits differ: the properties must catch it.
inline void matmul_two_halves(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                              int n_in, int n_out) {
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            float lo = 0.0f, hi = 0.0f;
            for (int k = 0; k < n_in / 2; k++) lo = lo + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
            for (int k = n_in / 2; k < n_in; k++) hi = hi + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
            y[std::int64_t(r) * ldy + o] = lo + hi;
        }
}

// A property run `n` times (RC_PARAMS's seed and the rest still apply): each case starts processes.
// shrink = false for cases that take seconds each, where shrinking would take many minutes.
inline void check_cases(int n, const std::function<void()>& property, bool shrink = true) {
    rc::detail::TestParams params = rc::detail::configuration().testParams;
    params.maxSuccess = n;
    params.disableShrinking = params.disableShrinking || !shrink;
    const rc::detail::TestResult result = rc::detail::checkTestable(property, rc::detail::TestMetadata{}, params);
    rc::detail::FailureResult failure;
    rc::detail::GaveUpResult gave_up;
    if (result.match(failure))
        FAIL("counterexample:\n" << kvlab::test::counterexample_text(failure) << failure.description);
    if (result.match(gave_up)) FAIL("gave up: " << gave_up.description);
    rc::detail::SuccessResult success;
    CHECK(result.match(success));
}

}  // namespace kvlab::test
