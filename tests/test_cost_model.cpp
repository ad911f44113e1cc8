// The cost model (core/cost_model.h): its FLOPs are the ones the kernels count, its bytes the ones
// the CPU backend holds and the cache stores, and its crossover T is where KV passes the weights.
// Its times are checked against measurement by `kvlab bench` (a benchmark, not a test).
#include <rapidcheck/catch.h>

#include <catch2/catch.hpp>
#include <vector>

#include "cache.h"
#include "cost_model.h"
#include "cpu_backend.h"
#include "decode.h"
#include "test_util.h"

using namespace kvlab;

namespace {

std::vector<int> some_tokens(const Config& c, int n) {
    std::vector<int> t(std::size_t(n), 0);  // [n]
    for (int i = 0; i < n; i++) t[std::size_t(i)] = (5 * i + 3) % c.vocab_size;
    return t;
}

AttentionSpec gen_attention() {
    if (*rc::gen::arbitrary<bool>()) return {};
    return {AttentionSpec::Kind::tiled, *rc::gen::inRange(1, 17)};
}

// What the decoders count for one step at context length T: a naive forward over T tokens, and a
// cached step at position T - 1 after a prefill of T - 1.
struct Counted {
    std::uint64_t naive = 0, cached = 0;
};
Counted counted_flops(const Model& m, int T, const AttentionSpec& a) {
    const std::vector<int> tokens = some_tokens(m.config(), T);
    Counted out;
    NaiveDecoder naive(m);
    naive.exec.attention = a;
    naive.forward(tokens);
    out.naive = naive.exec.flops;
    CachedDecoder cached(m);
    cached.exec.attention = a;
    if (T > 1) cached.prefill(std::span<const int>(tokens).first(std::size_t(T - 1)));
    const std::uint64_t before = cached.exec.flops;
    cached.decode(tokens.back());
    out.cached = cached.exec.flops - before;
    return out;
}

// RoPE's FLOPs in a step of `rows` rows: what a model that forgot it would miss.
std::uint64_t rope_flops(const Config& c, int rows) {
    return 6ull * std::uint64_t(c.n_layers) * std::uint64_t(rows) * std::uint64_t(c.n_heads + c.n_kv_heads) *
           std::uint64_t(c.head_size() / 2);
}

}  // namespace

TEST_CASE("the cost model's FLOPs are the ones the kernels count for naive and cached steps", "[cost]") {
    rc::prop("any shape, context length and attention", [] {
        const Config c = *test::gen_tiny_config(16, 24);
        const Model m = random_model(c, *rc::gen::arbitrary<std::uint64_t>());
        const int T = *rc::gen::inRange(1, c.max_seq + 1);
        const AttentionSpec a = gen_attention();
        const Counted k = counted_flops(m, T, a);
        RC_ASSERT(naive_step_cost(c, T, a).flops() == k.naive);
        RC_ASSERT(cached_step_cost(c, T, 4 * std::int64_t(c.head_size()), a).flops() == k.cached);
    });
}

TEST_CASE("counter-test: a cost model without RoPE's FLOPs is caught", "[cost]") {
    test::expect_failure(
        [] {
            const Config c = *test::gen_tiny_config(16, 24);
            const Model m = random_model(c, 1);
            const int T = *rc::gen::inRange(1, c.max_seq + 1);
            const StepCost s = naive_step_cost(c, T, {});
            RC_ASSERT(s.flops() - rope_flops(c, T) == counted_flops(m, T, {}).naive);
        },
        "RC_ASSERT");
}

TEST_CASE("the cost model's bytes: the CPU's panels, the cache's rows, and the T where KV passes the weights",
          "[cost]") {
    rc::prop("any shape", [] {
        const Config c = *test::gen_tiny_config(16, 24);
        const Model m = random_model(c, 2);
        const CpuBackend backend(m);
        const PackedWeights& p = *m.cpu_panels;
        double floats = double(PackedMatrix::floats(p.wcls.n_in, p.wcls.n_out));
        for (const PackedWeights::Layer& l : p.layers)
            for (const PackedMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3})
                floats += double(PackedMatrix::floats(w->n_in, w->n_out));
        RC_ASSERT(panel_bytes(c) == 4 * floats);
        const int T = *rc::gen::inRange(1, c.max_seq + 1);
        const StepCost s = cached_step_cost(c, T, 4 * std::int64_t(c.head_size()), {});
        RC_ASSERT(s.weight_bytes + s.classifier_bytes == panel_bytes(c));
        ContiguousCache cache(c);
        CachedDecoder d(m, cache);
        d.prefill(some_tokens(c, T));
        RC_ASSERT(s.kv_read_bytes == double(cache.memory().used_bytes));  // the step reads every stored row
        const int cross = kv_passes_weights_T(c, 4 * std::int64_t(c.head_size()));
        RC_ASSERT(cross >= 1);
        RC_ASSERT(cached_step_cost(c, cross, 4 * std::int64_t(c.head_size()), {}).kv_read_bytes > panel_bytes(c));
        if (cross > 1)
            RC_ASSERT(cached_step_cost(c, cross - 1, 4 * std::int64_t(c.head_size()), {}).kv_read_bytes <=
                      panel_bytes(c));
    });
}
