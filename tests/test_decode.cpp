// The decoders' exactness properties P1-P3, the counter-test that shows P1 can fail, and the
// contiguous cache's bookkeeping.
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>

#include "baseline.h"
#include "cpu_backend.h"
#include "decode.h"
#include "forwarding.h"
#include "kernel_oracles.h"
#include "paged.h"
#include "planted.h"
#include "property.h"
#include "sampler.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace kvlab;
using kvlab::first_difference;
using kvlab::test::gen_tiny_config;
using kvlab::test::gen_tokens;

namespace {

// P1's body: for a generated config, seed and token sequence, the naive decoder (with product
// `naive_matmul`, or the kernels when nullptr) and the cached decoder give bitwise-equal logits at every step. The
// first `prompt_len` tokens are prefilled, the rest decoded one at a time.
void check_naive_equals_cached(MatmulFn naive_matmul) {
    const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
    const Model m = random_model(c, seed);
    CpuBackend cpu(m);
    const std::unique_ptr<Backend> planted =
        naive_matmul ? std::make_unique<ProductBackend>(cpu, m, naive_matmul) : nullptr;
    NaiveDecoder naive(planted ? *planted : cpu);
    CachedDecoder cached(m);
    for (int T = prompt_len; T <= int(tokens.size()); T++) {
        const std::span<const int> prefix(tokens.data(), T);
        const std::vector<float> lc = T == prompt_len ? cached.prefill(prefix) : cached.decode(tokens[T - 1]);
        const std::vector<float>& ln = naive.forward(prefix);
        if (auto diff = first_difference(ln, lc))
            RC_FAIL(fmt::format("naive vs cached at T = {} (prompt {} tokens), {}, model seed {}: {}", T, prompt_len,
                                c.describe(), seed, *diff));
    }
}

// Y = X W with each dot product summed as `parts` chunks of k, added at the end.
void matmul_split_k(int parts, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                    int n_out) {
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            float total = 0.0f;
            for (int p = 0; p < parts; p++) {
                float s = 0.0f;
                for (int k = n_in * p / parts; k < n_in * (p + 1) / parts; k++) s = s + x[r * ldx + k] * w[k * ldw + o];
                total = total + s;
            }
            y[r * ldy + o] = total;
        }
}

// Planted bugs. Real engines do both: split-K kernels chosen by problem size, and reductions
// split across however many threads there are. Each breaks the numeric contract.
// 1. The split depends on the number of rows: two halves when there is more than one row.
void matmul_split_k_when_many_rows(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw,
                                   int rows, int n_in, int n_out) {
    ex.flops += 2ull * rows * n_in * n_out;
    matmul_split_k(rows == 1 ? 1 : 2, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}
// 2. The split depends on the number of threads: one chunk of k per thread.
void matmul_split_k_per_thread(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                               int n_in, int n_out) {
    ex.flops += 2ull * rows * n_in * n_out;
    matmul_split_k(ex.n_threads, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}

// Runs a property with a planted bug (fixed seed, so the printed counterexample can be
// replayed) and checks RapidCheck finds a failure that `expected` describes, and shrinks it.
void expect_caught(const std::function<void()>& property, const std::string& expected, const char* bug) {
    const rc::detail::FailureResult failure = kvlab::test::expect_failure(property, expected);
    CHECK(!failure.reproduce.shrinkPath.empty());
    std::printf("planted bug (%s) caught after %d passing cases, shrunk in %zu steps to:\n%s\n", bug,
                failure.numSuccess, failure.reproduce.shrinkPath.size(),
                kvlab::test::counterexample_text(failure).c_str());
}

}  // namespace

TEST_CASE("P1: cached decode equals naive decode, bit for bit, at every step", "[P1]") {
    rc::prop("naive and cached logits are bitwise equal", [] { check_naive_equals_cached(nullptr); });
}

TEST_CASE("P1 counter-test: an order-changing matmul in the naive path is caught and shrunk", "[P1][counter]") {
    // The shrunk case needs a step with more than one row, so T > 1.
    expect_caught([] { check_naive_equals_cached(matmul_split_k_when_many_rows); },
                  "naive vs cached at T = ", "split-K when rows > 1, naive path");
}

// P2's body: prefill (with product `matmul`, or the kernels when nullptr) then decode equals
// decoding every token one by one from an empty cache, logits and cache contents.
void check_prefill_equals_one_by_one(MatmulFn matmul) {
    const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
    const Model m = random_model(c, seed);
    CpuBackend cpu(m);
    const std::unique_ptr<Backend> planted = matmul ? std::make_unique<ProductBackend>(cpu, m, matmul) : nullptr;
    Backend& backend = planted ? *planted : cpu;
    CachedDecoder batched(backend), one_by_one(backend);
    std::vector<float> lb = batched.prefill(std::span<const int>(tokens.data(), prompt_len));
    std::vector<float> lo;
    for (int t = 0; t < prompt_len; t++) lo = one_by_one.decode(tokens[t]);
    for (int T = prompt_len;; T++) {
        if (auto diff = first_difference(lb, lo))
            RC_FAIL(fmt::format("prefill({}) vs one by one, logits at T = {}: {}", prompt_len, T, *diff));
        if (T == int(tokens.size())) break;
        lb = batched.decode(tokens[T]);
        lo = one_by_one.decode(tokens[T]);
    }
    const Cache &a = batched.cache(), &b = one_by_one.cache();
    RC_ASSERT(a.length() == b.length());
    const int hs = c.head_size();
    for (int l = 0; l < c.n_layers; l++)
        for (int h = 0; h < c.n_kv_heads; h++)
            for (int t = 0; t < a.length(); t++)
                if (std::memcmp(a.key(l, h, t), b.key(l, h, t), 4 * hs) ||
                    std::memcmp(a.value(l, h, t), b.value(l, h, t), 4 * hs))
                    RC_FAIL(
                        fmt::format("prefill({}) vs one by one, cache rows differ at layer {}, KV head {}, position {}",
                                    prompt_len, l, h, t));
}

TEST_CASE("P2: prefill then decode equals decoding every token from an empty cache", "[P2]") {
    rc::prop("logits and cache contents are bitwise equal", [] { check_prefill_equals_one_by_one(nullptr); });
}

TEST_CASE("P2 counter-test: a row-dependent split in prefill is caught", "[P2][counter]") {
    expect_caught([] { check_prefill_equals_one_by_one(matmul_split_k_when_many_rows); }, " vs one by one, ",
                  "split-K when rows > 1, both cached decoders");
}

// P3's body: 1, 2 and 4 threads give the same bits, naive and cached (with product `matmul`,
// or the kernels when nullptr).
void check_thread_count_invariance(MatmulFn matmul) {
    const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
    const Model m = random_model(c, seed);
    std::vector<std::vector<float>> runs;  // per thread count: naive logits then cached logits, every step
    for (int threads : {1, 2, 4}) {
        CpuBackend cpu(m);
        const std::unique_ptr<Backend> planted = matmul ? std::make_unique<ProductBackend>(cpu, m, matmul) : nullptr;
        Backend& backend = planted ? *planted : cpu;
        NaiveDecoder naive(backend);
        CachedDecoder cached(backend);
        naive.exec.n_threads = cached.exec.n_threads = threads;
        // Force every product onto the threads, however small, so the split is exercised.
        naive.exec.parallel_min_work = cached.exec.parallel_min_work = 0;
        pool_always_threads(true);
        std::vector<float> all;
        for (int T = prompt_len; T <= int(tokens.size()); T++) {
            const std::span<const int> prefix(tokens.data(), T);
            const std::vector<float>& ln = naive.forward(prefix);
            all.insert(all.end(), ln.begin(), ln.end());
            const std::vector<float>& lc = T == prompt_len ? cached.prefill(prefix) : cached.decode(tokens[T - 1]);
            all.insert(all.end(), lc.begin(), lc.end());
        }
        runs.push_back(std::move(all));
    }
    for (int i : {1, 2})
        if (auto diff = first_difference(runs[0], runs[i]))
            RC_FAIL(fmt::format("1 thread vs {} threads, {}: {}", i == 1 ? 2 : 4, c.describe(), *diff));
}

TEST_CASE("P3: results do not depend on the number of threads", "[P3]") {
    rc::prop("1, 2 and 4 threads give bitwise-equal logits, naive and cached",
             [] { check_thread_count_invariance(nullptr); });
}

TEST_CASE("P3 counter-test: a reduction split across threads is caught", "[P3][counter]") {
    expect_caught([] { check_thread_count_invariance(matmul_split_k_per_thread); }, "1 thread vs ",
                  "one chunk of k per thread");
}

TEST_CASE("the llama2.c-style sequential-dot decoder, the benchmark's yardstick, agrees bit for bit", "[baseline]") {
    // Same per-element order in a plain scalar loop: what the fast kernels must reproduce.
    rc::prop("sequential-dot logits equal naive logits at every step", [] {
        const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
        const Model m = random_model(c, seed);
        NaiveDecoder naive(m);
        SequentialDotDecoder seqdot(m);
        for (int T = 1; T <= int(tokens.size()); T++) {
            const std::vector<float> ls = seqdot.decode(tokens[T - 1]);
            if (auto diff = first_difference(naive.forward(std::span<const int>(tokens.data(), T)), ls))
                RC_FAIL(fmt::format("naive vs sequential-dot at T = {}, {}: {}", T, c.describe(), *diff));
        }
    });
}

namespace {

// Records the input of the last classifier product (the step's final normed rows), so that the
// logits can be checked against the float64 product.
class ClassifierProbe : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    std::vector<float> normed;  // [rows, dim]
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        ForwardingBackend::matmul(ex, y, ldy, x, ldx, m, l, rows);
        if (m != Matrix::wcls) return;
        assert(ldx == config().dim);  // x: [rows, dim]
        normed.assign(x, x + std::int64_t(rows) * ldx);
    }
};

// Planted: a classifier whose columns from 1024 on run a second kernel (for wide outputs) that
// stops k one short. Naive and cached decode share it, so they still agree bit for bit.
class WideClassifierDropsLastK : public ForwardingBackend {
public:
    WideClassifierDropsLastK(Backend& inner, const Model& model) : ForwardingBackend(inner), model_(model) {}
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        ForwardingBackend::matmul(ex, y, ldy, x, ldx, m, l, rows);
        if (m != Matrix::wcls) return;
        const int dim = config().dim;
        for (int r = 0; r < rows; r++)
            for (int o = 1024; o < config().vocab_size; o++) {
                const float* w = model_.w.wcls.data() + std::int64_t(o) * dim;  // W[o][0 .. dim - 1]
                float sum = 0.0f;
                for (int k = 0; k + 1 < dim; k++) sum = sum + x[std::int64_t(r) * ldx + k] * w[k];
                y[std::int64_t(r) * ldy + o] = sum;
            }
    }

private:
    const Model& model_;
};

// A thin model (1-2 layers, dim 1-8) with a big vocabulary (draw_vocab_size: up to 32000, often at
// 255-257, 1023-1025, 4095-4097, 32000) decoded greedily, naive and cached. At every step the two
// agree bit for bit, the logits are within the derived bound of the float64 product of the step's
// final normed row and the classifier, the token is the first largest logit, and its
// log-probability is within token_logprob's bound. A classifier or log-softmax that switches by
// vocabulary size gives both paths the same wrong bits: only the oracles see it.
void check_big_vocab(bool planted) {
    Config c;
    c.n_layers = *test::full_range(1, 3);
    c.n_heads = *test::full_range(1, 3);
    c.n_kv_heads = *rc::gen::element(1, c.n_heads);
    c.dim = c.n_heads * *test::full_range(c.n_heads == 1 ? 2 : 1, 5);
    c.hidden_dim = *test::full_range(1, 9);
    c.vocab_size = draw_vocab_size(2);
    c.max_seq = *test::full_range(2, 9);
    const auto seed = *rc::gen::arbitrary<std::uint64_t>();
    const int prompt_len = *test::full_range(1, c.max_seq);
    std::vector<int> tokens = draw_tokens(c, prompt_len);
    const Model m = random_model(c, seed);
    std::vector<float> wt(std::size_t(c.dim) * c.vocab_size);  // [dim, vocab_size]: the oracle's W[k][o]
    for (int o = 0; o < c.vocab_size; o++)
        for (int k = 0; k < c.dim; k++) wt[std::size_t(k) * c.vocab_size + o] = m.w.wcls[std::size_t(o) * c.dim + k];
    CpuBackend cpu(m);
    WideClassifierDropsLastK wide(cpu, m);
    Backend& backend = planted ? static_cast<Backend&>(wide) : cpu;
    ClassifierProbe probe(backend);
    NaiveDecoder naive(backend);
    CachedDecoder cached(probe);
    std::vector<float> lc = cached.prefill(tokens);
    for (;;) {
        const int T = int(tokens.size());
        if (auto diff = first_difference(naive.forward(tokens), lc))
            RC_FAIL(fmt::format("naive vs cached at T = {}, {}, model seed {}: {}", T, c.describe(), seed, *diff));
        oracle::check_matmul(probe.normed.data(), c.dim, wt.data(), c.vocab_size, lc.data(), c.vocab_size, 1, c.dim,
                             c.vocab_size);
        const int next = argmax(lc);
        oracle::check_argmax(lc, next);
        oracle::check_token_logprob(lc, next, token_logprob(lc.data(), c.vocab_size, next));
        if (T == c.max_seq) break;
        tokens.push_back(next);
        lc = cached.decode(next);
    }
}

}  // namespace

TEST_CASE("P1 at big vocabularies: greedy decode up to vocab_size 32000 is exact and its logits are the classifier's",
          "[P1][vocab]") {
    rc::prop("naive equals cached and the logits, argmax and log-probability match float64",
             [] { check_big_vocab(false); });
}

TEST_CASE("P1 at big vocabularies counter-test: a classifier whose columns past 1024 drop a term is caught",
          "[P1][vocab][counter]") {
    expect_caught([] { check_big_vocab(true); }, "matmul Y", "classifier columns past 1024 drop the last term");
}

TEST_CASE("the contiguous cache holds exactly 2 * 4 B * n_layers * T * n_kv_heads * head_size", "[cache]") {
    rc::prop("bytes agree with the formula at every length", [] {
        const Config c = *gen_tiny_config();
        const Model m = random_model(c, 1);
        CachedDecoder dec(m);
        RC_ASSERT(dec.cache().memory().reserved_bytes ==
                  2ll * 4 * c.n_layers * c.max_seq * c.n_kv_heads * c.head_size());
        const std::vector<int> tokens = gen_tokens(c);
        for (int t : tokens) {
            dec.decode(t);
            const std::int64_t T = dec.pos();
            RC_ASSERT(dec.cache().memory().used_bytes == 2 * 4 * c.n_layers * T * c.n_kv_heads * c.head_size());
        }
    });
}

TEST_CASE("unwritten cache memory is NaN, and truncate poisons what it forgets", "[cache]") {
    const Config c{16, 8, 2, 2, 1, 10, 6};
    const Model m = random_model(c, 3);
    CachedDecoder dec(m);
    const int tokens[] = {1, 2, 3};
    dec.prefill(tokens);
    CHECK(!std::isnan(dec.cache().key(1, 0, 2)[0]));
    CHECK(std::isnan(dec.cache().key(1, 0, 3)[0]));
    CHECK(std::isnan(dec.cache().value(0, 0, 5)[c.head_size() - 1]));
    dec.cache().truncate(1);
    CHECK(std::isnan(dec.cache().key(0, 0, 1)[0]));
    CHECK(!std::isnan(dec.cache().key(0, 0, 0)[0]));
    CHECK_THROWS_AS(dec.cache().truncate(2), Error);
    CHECK_THROWS_AS(dec.cache().truncate(-1), Error);
    // Decoding after a rollback equals decoding that never saw the forgotten tokens.
    const std::vector<float> after_rollback = dec.decode(7);
    CachedDecoder fresh(m);
    fresh.decode(1);
    CHECK(!first_difference(after_rollback, fresh.decode(7)));
}

TEST_CASE("bad tokens and overlong sequences are one-line errors, never truncation", "[errors]") {
    const Config c{16, 8, 1, 2, 2, 10, 4};
    const Model m = random_model(c, 3);
    NaiveDecoder naive(m);
    CachedDecoder cached(m);
    const std::vector<int> too_long = {1, 2, 3, 4, 5};
    CHECK_THROWS_WITH(naive.forward(too_long), "sequence of 5 tokens does not fit max_seq = 4");
    CHECK_THROWS_WITH(cached.prefill(too_long), "sequence of 5 tokens does not fit max_seq = 4");
    CHECK_THROWS_WITH(cached.decode(10), "token id 10 (at position 0) is outside the vocabulary [0, 10)");
    CHECK_THROWS_WITH(cached.decode(-1), "token id -1 (at position 0) is outside the vocabulary [0, 10)");
    CHECK_THROWS_WITH(naive.forward(std::vector<int>{}), Catch::Contains("at least one token"));
    // A failed call leaves the cache as it was.
    CHECK(cached.pos() == 0);
    cached.prefill(std::vector<int>{1, 2, 3, 4});
    CHECK_THROWS_WITH(cached.decode(5), "sequence of 5 tokens does not fit max_seq = 4");
    CHECK(cached.pos() == 4);
}

namespace {

// A CPU backend whose kernel call number `fail_at` (counted over every call) throws, as a device
// does when it runs out of memory or a launch fails partway through a step.
class FailingBackend final : public Backend {
public:
    FailingBackend(const Model& m, int fail_at) : fail_at_(fail_at), cpu_(m) {}
    std::string_view name() const override { return "failing"; }
    Memory& memory() override { return cpu_.memory(); }
    const Config& config() const override { return cpu_.config(); }
    void embed(Exec& ex, float* x, const int* t, int rows) override { tick(), cpu_.embed(ex, x, t, rows); }
    void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, Matrix m, int l, int rows) override {
        tick(), cpu_.matmul(ex, y, ldy, x, ldx, m, l, rows);
    }
    void rmsnorm(Exec& ex, float* out, const float* x, Norm n, int l, int rows) override {
        tick(), cpu_.rmsnorm(ex, out, x, n, l, rows);
    }
    void rope(Exec& ex, float* vec, int rows, int n_heads, const int* positions) override {
        tick(), cpu_.rope(ex, vec, rows, n_heads, positions);
    }
    void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) override {
        tick(), cpu_.silu_mul(ex, h1, h3, n);
    }
    void add(Exec& ex, float* x, const float* y, std::int64_t n) override { tick(), cpu_.add(ex, x, y, n); }
    void causal_attention(Exec& ex, float* att, const float* q, const float* k, const float* v, int T,
                          const int* kv_head) override {
        tick(), cpu_.causal_attention(ex, att, q, k, v, T, kv_head);
    }
    void store_kv(Exec& ex, const RowKV* rows, int n_rows, int l, const float* k, const float* v) override {
        tick(), cpu_.store_kv(ex, rows, n_rows, l, k, v);
    }
    void load_kv(Exec& ex, const RowKV* rows, int n_rows, int l, float* k, float* v) override {
        tick(), cpu_.load_kv(ex, rows, n_rows, l, k, v);
    }
    void attention(Exec& ex, float* att, const float* q, const RowKV* rows, int n_rows, int l,
                   const std::int64_t* slots, int max_n, const int* kv_head, int probe_row, float* probe) override {
        tick(), cpu_.attention(ex, att, q, rows, n_rows, l, slots, max_n, kv_head, probe_row, probe);
    }
    int fail_at_ = -1;  // -1: never

private:
    void tick() {
        if (fail_at_ >= 0 && calls_++ == fail_at_) throw Error("device error (planted)");
    }
    CpuBackend cpu_;
    int calls_ = 0;
};

}  // namespace

TEST_CASE("a step that fails at any kernel call leaves every cache as it was, and decoding goes on exactly",
          "[errors]") {
    rc::prop("failed step", [] {
        const Config c = *gen_tiny_config(8, 16);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const int bs = *rc::gen::inRange(1, c.max_seq + 1), per_seq = (c.max_seq + bs - 1) / bs;
        BlockPool pool(c, bs, 2 * per_seq);
        PagedCache a(pool, 0, 0), b(pool, 0, 1);
        FailingBackend backend(m, -1);
        CachedDecoder dec(backend, a);
        NaiveDecoder naive(m);
        std::vector<int> ta = gen_tokens(c), tb = gen_tokens(c);
        RC_PRE(ta.size() >= 2 && tb.size() >= 2);
        const std::size_t pa = *rc::gen::inRange<std::size_t>(1, ta.size()),
                          pb = *rc::gen::inRange<std::size_t>(1, tb.size());
        Cache* const both[] = {&a, &b};
        const std::vector<std::vector<int>> first{{ta.begin(), ta.begin() + std::ptrdiff_t(pa)},
                                                  {tb.begin(), tb.begin() + std::ptrdiff_t(pb)}};
        dec.step(both, first);
        // The next step fails at a generated call; nothing it touched may show.
        const std::vector<std::vector<int>> next{{ta[pa]}, {tb[pb]}};
        backend.fail_at_ = *rc::gen::inRange(0, 64);
        const int free_before = pool.n_free(), used_before = pool.n_used();
        bool failed = false;
        try {
            dec.step(both, next);
        } catch (const Error&) {
            failed = true;
        }
        RC_PRE(failed);  // a call number past the step's last call fails nothing
        backend.fail_at_ = -1;
        for (const auto& [cache, held] : {std::pair{&a, &first[0]}, std::pair{&b, &first[1]}}) {
            const std::vector<int> tokens(cache->tokens().begin(), cache->tokens().end());
            RC_ASSERT(tokens == *held);
        }
        RC_ASSERT(pool.n_free() == free_before);
        RC_ASSERT(pool.n_used() == used_before);
        // Retried, the step is exact.
        const std::vector<float> logits = dec.step(both, next);
        for (int s = 0; s < 2; s++) {
            const std::vector<int>& t = s == 0 ? ta : tb;
            const std::size_t p = s == 0 ? pa : pb;
            const std::vector<float>& ref = naive.forward(std::span(t).first(p + 1));
            RC_ASSERT(!first_difference(ref, std::span(logits).subspan(std::size_t(s) * c.vocab_size, c.vocab_size)));
        }
    });
}

TEST_CASE("config validation names the field at fault", "[errors]") {
    auto message = [](Config c) {
        try {
            c.validate();
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const Config ok{64, 172, 5, 8, 4, 512, 512};
    CHECK(message(ok) == "no error");
    CHECK(message({0, 172, 5, 8, 4, 512, 512}) == "config: dim must be positive, got 0");
    CHECK(message({64, 172, -1, 8, 4, 512, 512}) == "config: n_layers must be positive, got -1");
    CHECK(message({64, 172, 5, 3, 1, 512, 512}) == "config: n_heads (3) must divide dim (64)");
    CHECK(message({64, 172, 5, 8, 3, 512, 512}) == "config: n_kv_heads (3) must divide n_heads (8)");
    CHECK_THAT(message({1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 30}), Catch::Contains("too large"));
}

TEST_CASE("the viewer's attention probe changes no logit and copies the last row's softmax weights", "[probe]") {
    rc::prop("with and without a probe, every step's logits are bitwise equal", [] {
        const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
        const Model m = random_model(c, seed);
        CachedDecoder plain(m), probed(m);
        AttentionProbe probe;
        probed.observer = &probe;
        for (int T = prompt_len; T <= int(tokens.size()); T++) {
            const std::span<const int> fresh = T == prompt_len ? std::span<const int>(tokens.data(), prompt_len)
                                                               : std::span<const int>(&tokens[T - 1], 1);
            const std::vector<float> a = plain.prefill(fresh);
            RC_ASSERT(!first_difference(a, probed.prefill(fresh)));
            // The last row attends every position so far: weights in [0, 1] that sum to 1 up to
            // rounding (n additions of terms <= 1, each off by at most half an ulp of 1).
            RC_ASSERT(probe.n == T);
            for (int lh = 0; lh < c.n_layers * c.n_heads; lh++) {
                double sum = 0;
                for (int t = 0; t < T; t++) {
                    const float w = probe.weights[std::size_t(lh) * c.max_seq + t];
                    RC_ASSERT(w >= 0.0f);
                    RC_ASSERT(w <= 1.0f);
                    sum += w;
                }
                RC_ASSERT(std::abs(sum - 1.0) <= 1e-6 * T);
            }
        }
    });
}

namespace {

// An observer from outside core: watches one chosen row of each step and keeps what it saw.
class WatchRow final : public StepObserver {
public:
    explicit WatchRow(int row) : row_(row) {}
    int watch(const StepPlan& plan) override {
        seen.clear();
        attended = row_ < plan.rows() ? plan.kv[std::size_t(row_)].n : -1;
        return row_ < plan.rows() ? row_ : -1;
    }
    void attention_weights(int l, int n, std::span<const float> w) override {
        RC_ASSERT(n == attended);
        seen.push_back({w.begin(), w.end()});
        (void)l;
    }
    int attended = -1;
    std::vector<std::vector<float>> seen;  // [n_layers][n_heads * n]

private:
    int row_;
};

}  // namespace

// The observer property; `transform` (planted) edits the watched decoder's plans.
void check_observer(const std::function<void(StepPlan&)>& transform) {
    const auto [c, seed, tokens, prompt_len] = kvlab::test::gen_decode_case();
    const Model m = random_model(c, seed);
    const int row = *rc::gen::inRange(0, prompt_len);
    CachedDecoder plain(m), watched(m);
    WatchRow observer(row);
    watched.observer = &observer;
    watched.transform = transform;
    const std::span<const int> prompt(tokens.data(), std::size_t(prompt_len));
    RC_ASSERT(!first_difference(plain.prefill(prompt), watched.prefill(prompt)));
    RC_ASSERT(observer.attended == row + 1);
    RC_ASSERT(int(observer.seen.size()) == c.n_layers);
    for (const std::vector<float>& layer : observer.seen)
        for (int h = 0; h < c.n_heads; h++) {
            double sum = 0;
            for (int t = 0; t <= row; t++) sum += layer[std::size_t(h) * (row + 1) + t];
            RC_ASSERT(std::abs(sum - 1.0) <= 1e-6 * (row + 1));
        }
}

TEST_CASE("a step observer sees the row it watches, every layer, and changes no logit", "[probe]") {
    rc::prop("row i of a prefill attends positions 0..i; its weights sum to 1", [] { check_observer(nullptr); });
}

TEST_CASE("step observer counter-test: a step whose rows all attend the first position only is caught",
          "[probe][counter]") {
    const auto first_only = [](StepPlan& p) {
        for (RowKV& r : p.kv) r.n = 1;
    };
    const auto failure = kvlab::test::run_to_failure([&] { check_observer(first_only); });
    REQUIRE(failure);
    CHECK(failure->description.find("RC_ASSERT") != std::string::npos);
}
