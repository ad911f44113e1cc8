// Lab 1's grader: your FLOP formulas against the counters of kvlab's real decoders
// (Exec::flops, the way `kvlab demo` measures each step), exactly, over generated model shapes
// and lengths. A failure says whether the difference is inside each layer or outside the layers.
#include <functional>
#include <numeric>

#include "decode.h"
#include "grader.h"
#include "lab.h"

using namespace kvlab;

namespace {

using u64 = std::uint64_t;
using Count = std::function<u64(const Config&, int)>;  // FLOPs of one step at length T

// Tokens 0, 1, 2, ...: the counts depend on the shape and T only, never on tokens or weights.
std::vector<int> some_tokens(const Config& c, int T) {
    std::vector<int> t(static_cast<std::size_t>(T));
    std::iota(t.begin(), t.end(), 0);
    for (int& x : t) x %= c.vocab_size;
    return t;
}

// What the kernels count, as `kvlab demo` reads it: the counter before and after the step.
u64 counted_naive(const Model& m, int T) {
    NaiveDecoder naive(m);
    naive.forward(some_tokens(m.config(), T));
    return naive.exec.flops;
}
u64 counted_cached_step(const Model& m, int T) {
    CachedDecoder cached(m);
    const std::vector<int> tokens = some_tokens(m.config(), T);
    if (T > 1) cached.prefill(std::span<const int>(tokens).first(std::size_t(T - 1)));
    const u64 before = cached.exec.flops;
    cached.decode(tokens.back());
    return cached.exec.flops - before;
}
u64 counted_prefill(const Model& m, int P) {
    CachedDecoder cached(m);
    cached.prefill(some_tokens(m.config(), P));
    return cached.exec.flops;
}

// The same on a model of shape c (zero weights: the counters do not look at them).
Count on_shape(u64 (*counted)(const Model&, int)) {
    return [counted](const Config& c, int T) { return counted(Model(Weights(c)), T); };
}

std::string signed_diff(u64 yours, u64 kernels) {
    return yours < kernels ? fmt::format("{} too few", kernels - yours) : fmt::format("{} too many", yours - kernels);
}

// Fails unless yours(c, T) == counted(c, T), saying where they part: per layer (one more layer
// adds this much) or outside the layers (what is left with the layers taken away).
void expect_same(const char* fn, const Config& c, int T, const Count& yours, const Count& counted) {
    lessons::log_case(fmt::format("{}(c, T {}) with {}", fn, T, c.describe()));
    const u64 y = yours(c, T), k = counted(c, T);
    if (y == k) return;
    Config more = c;
    more.n_layers++;
    lessons::log_case(
        fmt::format("{}(c, T {}) with {} (one layer more, to find where it differs)", fn, T, more.describe()));
    const u64 y_layer = yours(more, T) - y, k_layer = counted(more, T) - k;  // unsigned wrap is fine: compared only
    const u64 y_out = y - c.n_layers * y_layer, k_out = k - c.n_layers * k_layer;
    std::string where;
    if (y_layer != k_layer)
        where += fmt::format("inside each layer (the kernels count {} per layer, your formula {})", k_layer, y_layer);
    if (y_out != k_out)
        where += fmt::format("{}outside the layers (final rmsnorm and classifier: the kernels count {}, your formula "
                             "{})",
                             where.empty() ? "" : " and ", k_out, y_out);
    fail(fmt::format("{}(c, {}) with {}: the kernels counted {} FLOPs, your formula says {} ({}); the difference is {}",
                     fn, T, c.describe(), k, y, signed_diff(y, k), where));
}

void check_naive() {
    const Config c = draw_config();
    expect_same("naive_step_flops", c, draw(1, c.max_seq), lab01::naive_step_flops, on_shape(counted_naive));
}

void check_cached() {
    const Config c = draw_config();
    expect_same("cached_step_flops", c, draw(1, c.max_seq), lab01::cached_step_flops, on_shape(counted_cached_step));
}

void check_prefill() {
    const Config c = draw_config();
    expect_same("prefill_flops", c, draw(1, c.max_seq), lab01::prefill_flops, on_shape(counted_prefill));
}

// The shape `kvlab demo` runs (stories260K: dim 64, 5 layers, 8 heads, 4 KV heads, vocab 512)
// at the lengths of its default run (a 5-token prompt and 64 steps: T up to 69).
void check_demo_shape() {
    static const Model m{Weights(stories260k_shape())};
    const Config& c = m.config();
    const int T = draw(1, 69);
    auto same_model = [&](u64 (*counted)(const Model&, int)) -> Count {
        return [&, counted](const Config& k, int t) { return k == c ? counted(m, t) : on_shape(counted)(k, t); };
    };
    expect_same("naive_step_flops", c, T, lab01::naive_step_flops, same_model(counted_naive));
    expect_same("cached_step_flops", c, T, lab01::cached_step_flops, same_model(counted_cached_step));
    expect_same("prefill_flops", c, T, lab01::prefill_flops, same_model(counted_prefill));
}

}  // namespace

int main(int argc, char** argv) {
    lessons::Lab lab{1, "why decoding is slow", LAB_SOURCE, {}};
    lab.checks = {
        {"naive_step_flops: the whole prefix again, every step", 3, check_naive},
        {"cached_step_flops: one row against the cache", 3, check_cached},
        {"prefill_flops: the prompt as one cached step", 2, check_prefill},
        {"all three at the demo's shape (stories260K), T <= 69", 2, check_demo_shape, 30},
    };
    return lessons::grade(lab, argc, argv);
}
