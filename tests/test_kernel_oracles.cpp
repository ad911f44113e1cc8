// The kernels no backend runs on their own, against their float64 oracles (tests/kernel_oracles.h):
// the raw products (kernels.cpp's tiled matmul, which naive attention's products run on, and
// matmul_reference), softmax on any row (-inf and far-out-of-range scores that attention never
// forms), exp_f32 anywhere, the RoPE table checker, and over vocabularies up to 32000 token_logprob,
// argmax, the classifier and the sampler's multinomial and top-p draws. Each oracle has a
// counter-test: a planted bug that it must catch.
//
// Every backend kernel (embed, the weights' products, rmsnorm, rope, silu_mul, add, naive and
// cached attention, the K/V store) runs against the same oracles in the backend table,
// tests/test_backend_ops.cpp, with its planted bugs there.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernel_oracles.h"
#include "kernels.h"
#include "property.h"
#include "sampler.h"
#include "test_util.h"

using kvlab::Exec;
using namespace kvlab::oracle;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// An integer in [lo, hi], both included, drawn by RapidCheck at full size.
int draw(int lo, int hi) { return kvlab::draw(lo, hi); }

std::vector<float> hostile(std::int64_t n, int lo_exp, int hi_exp) { return hostile_vector(draw, n, lo_exp, hi_exp); }

// ---- matmul on raw arrays: rows 1-2, n_in 0-39, n_out 1-8.
void matmul_oracle(kvlab::MatmulFn mm) {
    const int rows = draw(1, 2), n_in = draw(0, 39), n_out = draw(1, 8);
    // Scales up to 2^55: products below 2^112, sums of 40 of them far below float's 2^128.
    const std::vector<float> x = hostile(rows * n_in, -149, 55);   // [rows, n_in]
    const std::vector<float> w = hostile(n_in * n_out, -149, 55);  // [n_in, n_out]
    std::vector<float> y(std::size_t(rows) * n_out, -1.0f);        // [rows, n_out]
    assert(x.size() == std::size_t(rows) * n_in && w.size() == std::size_t(n_in) * n_out);
    Exec ex;
    mm(ex, y.data(), n_out, x.data(), n_in, w.data(), n_out, rows, n_in, n_out);
    check_matmul(x.data(), n_in, w.data(), n_out, y.data(), n_out, rows, n_in, n_out);
}

// ---- softmax over 1-39 scores from subnormal to 2^100 (far past exp's range, so a kernel that
// forgets to subtract the maximum overflows), a quarter of them -inf (masked); entry 0 stays
// finite, as in a causal row.
using SoftmaxFn = std::function<void(float*, int)>;

void softmax_oracle(const SoftmaxFn& softmax) {
    const int n = draw(1, 39);
    std::vector<float> x = hostile(n, -149, 100);  // [n]
    for (int i = 1; i < n; i++)
        if (draw(0, 3) == 0) x[i] = neg_inf;
    std::vector<float> p = x;
    softmax(p.data(), n);
    check_softmax(x, p);
}

// exp_f32 is within 1 ulp of the correctly rounded e^x wherever e^x is a normal float, for any
// bit pattern in that range (the sweep in test_kernels.cpp covers a grid; this draws anywhere).
using ExpFn = std::function<float(float)>;

void exp_oracle(const ExpFn& exp) {
    const float x = std::bit_cast<float>(*rc::gen::arbitrary<std::uint32_t>());
    RC_PRE(x >= -87.3f && x <= 88.7f);  // e^x normal and finite
    const float want = float(std::exp(double(x)));
    const std::uint64_t d = kvlab::ulp_distance(exp(x), want);
    if (d > 1) kvlab::fail(fmt::format("exp_f32({:a}) = {:a}, {} ulp from e^x = {:a}", x, exp(x), d, want));
}

// ---- A vocabulary's logits, where a classifier or log-softmax kernel that switches by size would
// show: n from draw_vocab_size (up to 32000, often 255-257, 1023-1025, 4095-4097, 31999-32000),
// values spread * [-1, 1) from a drawn seed (32000 values drawn one by one would take RapidCheck
// seconds to shrink), and the largest placed at a drawn index: the first, the last, in the last
// block of 1024 (a kernel's last chunk), past 1024, or anywhere. It exceeds the others' largest by
// a drawn gap (0: a tie; 100: e^gap overflows float, so a kernel that misses the maximum overflows),
// and a quarter of the time is copied to another index (a tie: the first index must win).
struct Logits {
    std::vector<float> x;  // [n]
    int peak = 0;          // where the largest was placed
};

Logits draw_logits() {
    const int n = kvlab::draw_vocab_size(1);
    const float spread = *rc::gen::element(1.0f, 20.0f, 200.0f);
    kvlab::SplitMix64 rng(*rc::gen::arbitrary<std::uint64_t>());
    Logits l;
    l.x.resize(std::size_t(n));
    assert(l.x.size() == std::size_t(n));
    for (float& v : l.x) v = float(spread * (2 * rng.uniform() - 1));
    const int last_chunk = n > 1024 ? (n - 1) / 1024 * 1024 : 0;  // the first index of the last block of 1024
    switch (draw(0, 4)) {
        case 0: l.peak = 0; break;
        case 1: l.peak = n - 1; break;
        case 2: l.peak = draw(last_chunk, n - 1); break;
        case 3: l.peak = draw(std::min(1024, n - 1), n - 1); break;
        default: l.peak = draw(0, n - 1); break;
    }
    float rest = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; i++)
        if (i != l.peak) rest = std::max(rest, l.x[std::size_t(i)]);
    const float gap = *rc::gen::element(0.0f, 0x1p-20f, 1.0f, 50.0f, 100.0f);
    l.x[std::size_t(l.peak)] = n == 1 ? l.x[0] : rest + gap;
    if (draw(0, 3) == 0) l.x[std::size_t(draw(0, n - 1))] = l.x[std::size_t(l.peak)];
    return l;
}

using LogprobFn = float (*)(const float*, int, int);

void vocab_logprob_oracle(LogprobFn logprob) {
    const Logits l = draw_logits();
    const int n = int(l.x.size());
    const int token = *rc::gen::element(l.peak, 0, n - 1, draw(0, n - 1));
    check_token_logprob(l.x, token, logprob(l.x.data(), n, token));
}

using ArgmaxFn = int (*)(const std::vector<float>&);

// argmax, and the sampler at temperature 0 (greedy decoding), both through `argmax`'s choice.
void vocab_argmax_oracle(ArgmaxFn argmax) {
    const Logits l = draw_logits();
    check_argmax(l.x, argmax(l.x));
    if (argmax != kvlab::argmax) return;  // a planted argmax is not the sampler's
    std::vector<float> logits = l.x;
    kvlab::Sampler greedy(int(l.x.size()), 0.0f, 0.9f, 1);
    check_argmax(l.x, greedy.sample(logits));
}

// ---- Multinomial and top-p sampling (core/sampler.h, llama2.c's), decided by one coin per token.
//
// The sampler leaves its probabilities p' in the logits (checked here against float64 by
// check_softmax, on logits / temperature as it divides them), draws coin = random_f32 of its
// state (reproduced from a copy of the seed) and walks a float cumulative of p'. The oracle walks
// it in float64 on the same p', with partial sums S_i of terms 0..i (within gamma64(i + 1) S_i of
// exact). The float sums c_i start with an exact first term; each later addition k rounds within
// u c_k <= u (1 + gamma(k)) S_k (nonnegative terms, Higham 4.2), so
//   |c_i - S_i| <= E_i = u (1 + gamma(i)) (S_1 + ... + S_i) + gamma64(i + 1) S_i,
// about i u S_i at most, less when the mass comes late; and the c_i never decrease. So the sampler
// draws i only if c_(i-1) <= coin < c_i, which needs
//   S_(i-1) - E_(i-1) <= coin  and  coin < S_i + E_i
// but for the fallback, the last token, which has no upper end: one token, or several when the
// coin is within E of a boundary. A token of p' = 0 leaves the sum as it was, so it is drawn only
// as the fallback.
//
// Top-p: the candidates are the tokens with p' >= (1 - top_p) / (n - 1) (two float roundings:
// within (1 +- u)^2 of the float64 cutoff), or all n when none is; sorted by p' descending, ties
// by index (the oracle sorts the same p', so the order is exact); the nucleus is the shortest
// prefix whose float cumulative exceeds top_p, or all candidates; r = coin * its cumulative (one
// rounding) is walked as above within it, its last token the fallback. So the nucleus has
// L = min(C, K) tokens, C a candidate count within the cutoff's rounding and K a first length with
// S_(K-1) > top_p within E_(K-1); for each such L, r is within coin (S_(L-1) +- E_(L-1)) (1 +- u),
// and the oracle accepts the token's sorted position i < L that some r in that range reaches.
struct Walk {
    std::vector<double> S, E;  // [n] float64 partial sums of q, in its order, and their slack
    std::vector<float> q;      // [n] p' in the order walked
    // Whether position i can be drawn in a walk of the first L positions by an r in [r_lo, r_hi].
    bool reaches(int i, int L, double r_lo, double r_hi) const {
        const std::size_t k = std::size_t(i);
        if (i >= L || (q[k] == 0 && i != L - 1)) return false;
        if (i > 0 && !(S[k - 1] - E[k - 1] <= r_hi)) return false;
        return i == L - 1 || r_lo < S[k] + E[k];
    }
    // The float64 walk's position for r over the first L positions.
    int position(int L, double r) const {
        for (int i = 0; i < L; i++)
            if (r < S[std::size_t(i)]) return i;
        return L - 1;
    }
};

Walk walk(std::vector<float> q) {
    const std::size_t n = q.size();
    Walk w{std::vector<double>(n), std::vector<double>(n), std::move(q)};
    double sum = 0, partial_sums = 0;  // S_1 + ... + S_i
    for (std::size_t i = 0; i < n; i++) {
        w.S[i] = sum += double(w.q[i]);
        if (i > 0) partial_sums += sum;
        w.E[i] = u * (1 + gamma(int(i))) * partial_sums + gamma64(int(i) + 1) * sum;
    }
    return w;
}

void check_multinomial(const std::vector<float>& p, float coin, int got) {
    const int n = int(p.size());
    const Walk w = walk(p);
    if (got < 0 || got >= n || !w.reaches(got, n, coin, coin)) {
        const int want = w.position(n, coin);
        kvlab::fail(
            fmt::format("multinomial over {} tokens: coin {:a} drew token {} (p' {:a}), the float64 "
                        "cumulative selects token {} (p' {:a}, cumulative {:.9g} to {:.9g})",
                        n, coin, got, got >= 0 && got < n ? p[std::size_t(got)] : 0.0f, want, p[std::size_t(want)],
                        want > 0 ? w.S[std::size_t(want) - 1] : 0.0, w.S[std::size_t(want)]));
    }
}

void check_top_p(const std::vector<float>& p, float top_p, float coin, int got) {
    const int n = int(p.size());
    std::vector<int> order(p.size());  // [n] tokens by p' descending, ties by index
    for (int i = 0; i < n; i++) order[std::size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[std::size_t(a)] > p[std::size_t(b)]; });
    std::vector<float> q(p.size());
    std::vector<int> position(p.size());  // [n] a token's place in order
    for (int k = 0; k < n; k++)
        q[std::size_t(k)] = p[std::size_t(order[std::size_t(k)])], position[std::size_t(order[std::size_t(k)])] = k;
    const Walk w = walk(q);
    const double t = top_p, cut = (1 - t) / double(n - 1);  // n = 1: +inf, no candidate
    auto count_at_least = [&](double c) {
        int k = 0;
        while (k < n && double(q[std::size_t(k)]) >= c) k++;
        return k;
    };
    const int c_lo = count_at_least(cut * (1 + u) * (1 + u) * (1 + 4 * u64)),
              c_hi = count_at_least(cut * (1 - u) * (1 - u) * (1 - 4 * u64));
    auto first_past = [&](double side) {  // the first length K whose S_(K-1) + side E_(K-1) > top_p; n + 1: none
        int K = 1;
        while (K <= n && !(w.S[std::size_t(K) - 1] + side * w.E[std::size_t(K) - 1] > t)) K++;
        return K;
    };
    const int k_lo = first_past(1), k_hi = first_past(-1);
    bool ok = false;
    auto try_lengths = [&](int from, int to) {
        for (int L = from; L <= to && !ok; L++) {
            const double c = w.S[std::size_t(L) - 1], e = w.E[std::size_t(L) - 1];
            ok = w.reaches(position[std::size_t(got)], L, coin * (c - e) * (1 - u) - tiny,
                           coin * (c + e) * (1 + u) + tiny);
        }
    };
    if (got >= 0 && got < n) {
        if (c_hi >= 1) try_lengths(std::min(std::max(c_lo, 1), k_lo), std::min(c_hi, k_hi));
        if (c_lo == 0) try_lengths(std::min(n, k_lo), std::min(n, k_hi));
    }
    if (!ok) {
        const int C = count_at_least(cut), L = std::min(C == 0 ? n : C, first_past(0));
        const int want = order[std::size_t(w.position(L, coin * w.S[std::size_t(L) - 1]))];
        kvlab::fail(
            fmt::format("top-p {} over {} tokens: coin {:a} drew token {} (p' {:a}, sorted position {}), "
                        "the float64 nucleus is the first {} by p' (mass {:.9g}) and the coin selects "
                        "token {} (p' {:a}, sorted position {})",
                        top_p, n, coin, got, got >= 0 && got < n ? p[std::size_t(got)] : 0.0f,
                        got >= 0 && got < n ? position[std::size_t(got)] : -1, L, w.S[std::size_t(L) - 1], want,
                        p[std::size_t(want)], position[std::size_t(want)]));
    }
}

// A sampler under test, as Sampler is made: (vocab_size, temperature, top_p, seed) -> draw one
// token from logits, in place.
using SampleFn = std::function<int(std::vector<float>&)>;
using MakeSampler = SampleFn (*)(int, float, float, std::uint64_t);

SampleFn kvlab_sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed) {
    auto s = std::make_shared<kvlab::Sampler>(vocab_size, temperature, top_p, seed);
    return [s](std::vector<float>& logits) { return s->sample(logits); };
}

// draw_logits' vocabularies at a drawn temperature, 1-3 tokens in a row from a drawn non-zero
// seed; top-p with top_p in (0, 1) (round values and any thousandth), else multinomial (top_p 0 or 1).
void vocab_sampling_oracle(MakeSampler make, bool nucleus) {
    const Logits l = draw_logits();
    const int n = int(l.x.size());
    const float temperature = *rc::gen::element(0.25f, 1.0f, 2.0f);
    const float top_p = !nucleus     ? *rc::gen::element(0.0f, 1.0f)
                        : draw(0, 1) ? *rc::gen::element(0.5f, 0.9f, 0.95f, 0.999f)
                                     : float(draw(1, 999)) / 1000.0f;
    const std::uint64_t seed = std::max<std::uint64_t>(1, *rc::gen::arbitrary<std::uint64_t>());
    std::vector<float> scaled = l.x;  // [n] logits / temperature, as the sampler divides them
    for (float& x : scaled) x /= temperature;
    const SampleFn sample = make(n, temperature, top_p, seed);
    std::uint64_t state = seed;  // the sampler's generator, one coin per token
    for (int draws = draw(1, 3); draws > 0; draws--) {
        std::vector<float> p = l.x;
        const int got = sample(p);
        const float coin = kvlab::random_f32(state);
        check_softmax(scaled, p);
        if (nucleus)
            check_top_p(p, top_p, coin, got);
        else
            check_multinomial(p, coin, got);
    }
}

// ---- The classifier: logits[rows, vocab_size] = x[rows, dim] · W, W held [vocab_size, dim] (out,
// in) and packed into panels as the CPU backend packs wcls; dim 1-64, vocab_size up to 32000, values
// from anywhere in float's domain (scales up to 2^55, as matmul_oracle's), from a drawn seed.
using ClassifierFn = void (*)(kvlab::Exec&, float* y, const float* x, const kvlab::PackedMatrix& w, int rows);

void classifier_oracle(ClassifierFn classify) {
    const int rows = draw(1, 3), dim = kvlab::draw_size(1, 64), vocab_size = kvlab::draw_vocab_size(1);
    kvlab::SplitMix64 rng(*rc::gen::arbitrary<std::uint64_t>());
    auto seeded = [&](int lo, int hi) { return lo + int(rng.next() % std::uint64_t(hi - lo + 1)); };
    const std::vector<float> x = hostile_vector(seeded, std::int64_t(rows) * dim, -149, 55);        // [rows, dim]
    const std::vector<float> w = hostile_vector(seeded, std::int64_t(vocab_size) * dim, -149, 55);  // [vocab_size, dim]
    std::vector<float> panels(std::size_t(kvlab::PackedMatrix::floats(dim, vocab_size)));
    kvlab::PackedMatrix::pack(w.data(), dim, vocab_size, panels.data());
    const kvlab::PackedMatrix packed{dim, vocab_size, panels.data()};
    std::vector<float> y(std::size_t(rows) * vocab_size, -1.0f);  // [rows, vocab_size]
    kvlab::Exec ex;
    classify(ex, y.data(), x.data(), packed, rows);
    std::vector<float> wt(w.size());  // [dim, vocab_size]: the oracle's W[k][o]
    for (int o = 0; o < vocab_size; o++)
        for (int k = 0; k < dim; k++) wt[std::size_t(k) * vocab_size + o] = w[std::size_t(o) * dim + k];
    check_matmul(x.data(), dim, wt.data(), vocab_size, y.data(), vocab_size, rows, dim, vocab_size);
}

void packed_classifier(kvlab::Exec& ex, float* y, const float* x, const kvlab::PackedMatrix& w, int rows) {
    kvlab::matmul_packed(ex, y, w.n_out, x, w.n_in, w, rows);
}

}  // namespace

TEST_CASE("kernel oracles: matmul is within the derived bound of the float64 sum, over the whole domain",
          "[kernels][oracle]") {
    rc::prop("matmul vs float64", [] { matmul_oracle(kvlab::matmul); });
    rc::prop("matmul_reference vs float64", [] { matmul_oracle(kvlab::matmul_reference); });
}

TEST_CASE("kernel oracles: softmax (huge, subnormal and tied scores, -inf) is within the derived bound",
          "[kernels][oracle]") {
    rc::prop("softmax vs float64", [] { softmax_oracle(kvlab::softmax); });
}

TEST_CASE("kernel oracles: exp_f32 within 1 ulp for every float whose e^x is normal", "[kernels][oracle]") {
    rc::prop("exp_f32 vs float64", [] { exp_oracle([](float x) { return kvlab::exp_f32(x); }); });
}

TEST_CASE(
    "kernel oracles: token_logprob over vocabularies up to 32000 with the maximum anywhere is within the "
    "derived bound",
    "[kernels][oracle][vocab]") {
    rc::prop("token_logprob vs float64, n up to 32000", [] { vocab_logprob_oracle(kvlab::token_logprob); });
}

TEST_CASE("kernel oracles: argmax and greedy sampling over vocabularies up to 32000 pick the first largest logit",
          "[kernels][oracle][vocab]") {
    rc::prop("argmax vs the first index of the largest", [] { vocab_argmax_oracle(kvlab::argmax); });
}

TEST_CASE(
    "kernel oracles: multinomial and top-p sampling over vocabularies up to 32000 draw the token the coin selects "
    "in the float64 cumulative",
    "[kernels][oracle][vocab][sampler]") {
    rc::prop("multinomial vs the float64 cumulative, n up to 32000",
             [] { vocab_sampling_oracle(kvlab_sampler, false); });
    rc::prop("top-p vs the float64 nucleus, n up to 32000", [] { vocab_sampling_oracle(kvlab_sampler, true); });
}

TEST_CASE("kernel oracles: the packed classifier over vocabularies up to 32000 is within the derived bound",
          "[kernels][oracle][vocab]") {
    rc::prop("classifier vs float64, vocab_size up to 32000", [] { classifier_oracle(packed_classifier); });
}

namespace {

// Planted size switches past 1024 logits, each a kernel written for blocks of 1024.
// A log-softmax that sums n / 1024 whole blocks past one block: the last partial block is forgotten.
float logprob_drops_last_block(const float* x, int n, int token) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = std::max(max, x[i]);
    const int end = n > 1024 ? n - n % 1024 : n;
    float sum = 0.0f;
    for (int i = 0; i < end; i++) sum = sum + kvlab::exp_f32(x[i] - max);
    return (x[token] - max) - kvlab::log_f32(sum);
}

// An argmax that takes each block of 1024's first maximum, then the blocks' with >=: on a tie
// across blocks the later block wins.
int argmax_later_block_wins(const std::vector<float>& x) {
    int best = 0;
    for (int b0 = 0; b0 < int(x.size()); b0 += 1024) {
        int in_block = b0;
        for (int i = b0 + 1; i < std::min(int(x.size()), b0 + 1024); i++)
            if (x[std::size_t(i)] > x[std::size_t(in_block)]) in_block = i;
        if (b0 == 0 || x[std::size_t(in_block)] >= x[std::size_t(best)]) best = in_block;
    }
    return best;
}

// A classifier whose columns from 1024 on run a second kernel (for wide outputs) that stops k one short.
void classifier_wide_drops_last_k(kvlab::Exec& ex, float* y, const float* x, const kvlab::PackedMatrix& w, int rows) {
    packed_classifier(ex, y, x, w, rows);
    const int panel = kvlab::PackedMatrix::kPanel;
    for (int r = 0; r < rows; r++)
        for (int o = 1024; o < w.n_out; o++) {
            const float* column =
                w.panels + std::int64_t(o / panel) * w.n_in * panel + o % panel;  // W[k][o] at k * panel
            float sum = 0.0f;
            for (int k = 0; k + 1 < w.n_in; k++)
                sum = sum + x[std::int64_t(r) * w.n_in + k] * column[std::int64_t(k) * panel];
            y[std::int64_t(r) * w.n_out + o] = sum;
        }
}

// The sampler (core/sampler.cpp) with one size switch past 1024 tokens.
enum class SamplerBug { multinomial_stops_at_1024, top_p_drops_past_1024, top_p_cutoff_over_1023 };

template <SamplerBug bug>
SampleFn planted_sampler(int n, float temperature, float top_p, std::uint64_t seed) {
    auto state = std::make_shared<std::uint64_t>(seed);
    return [=](std::vector<float>& x) {
        for (float& v : x) v /= temperature;
        const float max = *std::max_element(x.begin(), x.end());
        float sum = 0.0f;
        for (float& v : x) sum += v = kvlab::exp_f32(v - max);
        for (float& v : x) v /= sum;
        const float coin = kvlab::random_f32(*state);
        if (top_p <= 0.0f || top_p >= 1.0f) {  // the cumulative stops at the first block of 1024
            const int end = bug == SamplerBug::multinomial_stops_at_1024 ? std::min(n, 1024) : n;
            float cdf = 0.0f;
            for (int i = 0; i < end; i++)
                if (coin < (cdf += x[std::size_t(i)])) return i;
            return n - 1;
        }
        // The cutoff over a block of 1024's 1023, or the candidates of the first block only.
        const int over = bug == SamplerBug::top_p_cutoff_over_1023 && n > 1024 ? 1023 : n - 1;
        const float cutoff = (1.0f - top_p) / float(over);
        const int end = bug == SamplerBug::top_p_drops_past_1024 ? std::min(n, 1024) : n;
        std::vector<std::pair<float, int>> c;
        for (int i = 0; i < end; i++)
            if (x[std::size_t(i)] >= cutoff) c.push_back({x[std::size_t(i)], i});
        if (c.empty())
            for (int i = 0; i < n; i++) c.push_back({x[std::size_t(i)], i});
        std::stable_sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        float cumulative = 0.0f;
        std::size_t last = c.size() - 1;
        for (std::size_t i = 0; i < c.size(); i++)
            if ((cumulative += c[i].first) > top_p) {
                last = i;
                break;
            }
        const float r = coin * cumulative;
        float cdf = 0.0f;
        for (std::size_t i = 0; i <= last; i++)
            if (r < (cdf += c[i].first)) return c[i].second;
        return c[last].second;
    };
}

}  // namespace

TEST_CASE("kernel oracles counter-test: size switches past 1024 logits are caught by the vocabulary oracles",
          "[kernels][oracle][vocab][counter]") {
    SECTION("a log-softmax that forgets the last partial block of 1024") {
        kvlab::test::expect_failure([] { vocab_logprob_oracle(logprob_drops_last_block); }, "token_logprob of token");
    }
    SECTION("an argmax whose later block of 1024 wins a tie") {
        kvlab::test::expect_failure([] { vocab_argmax_oracle(argmax_later_block_wins); },
                                    "the first index of the largest");
    }
    SECTION("a classifier whose columns past 1024 drop the last term") {
        kvlab::test::expect_failure([] { classifier_oracle(classifier_wide_drops_last_k); }, "matmul Y");
    }
    SECTION("a multinomial sampler whose cumulative stops at 1024 tokens") {
        kvlab::test::expect_failure(
            [] { vocab_sampling_oracle(planted_sampler<SamplerBug::multinomial_stops_at_1024>, false); },
            "multinomial over");
    }
    SECTION("a top-p sampler whose candidates stop at 1024 tokens") {
        kvlab::test::expect_failure(
            [] { vocab_sampling_oracle(planted_sampler<SamplerBug::top_p_drops_past_1024>, true); }, "top-p");
    }
    SECTION("a top-p sampler whose cutoff past 1024 tokens is (1 - top_p) / 1023") {
        kvlab::test::expect_failure(
            [] { vocab_sampling_oracle(planted_sampler<SamplerBug::top_p_cutoff_over_1023>, true); }, "top-p");
    }
}

TEST_CASE("kernel oracles counter-test: a planted bug in each kernel is caught by its oracle",
          "[kernels][oracle][counter]") {
    SECTION("matmul that drops the last term") {
        kvlab::test::expect_failure(
            [] {
                matmul_oracle([](Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw,
                                 int rows, int n_in, int n_out) {
                    kvlab::matmul_reference(ex, y, ldy, x, ldx, w, ldw, rows, n_in > 0 ? n_in - 1 : 0, n_out);
                });
            },
            "matmul Y");
    }
    SECTION("softmax that does not subtract the maximum (overflows on large scores)") {
        kvlab::test::expect_failure(
            [] {
                softmax_oracle([](float* x, int n) {
                    float sum = 0;
                    for (int i = 0; i < n; i++) sum = sum + (x[i] = kvlab::exp_f32(x[i]));
                    for (int i = 0; i < n; i++) x[i] = x[i] / sum;
                });
            },
            "softmax of");
    }
    SECTION("softmax whose sum skips the last entry") {
        kvlab::test::expect_failure(
            [] {
                softmax_oracle([](float* x, int n) {
                    float max = x[0];
                    for (int i = 1; i < n; i++) max = std::max(max, x[i]);
                    float sum = 0;
                    for (int i = 0; i < n; i++) {
                        x[i] = kvlab::exp_f32(x[i] - max);
                        if (i + 1 < n) sum = sum + x[i];
                    }
                    for (int i = 0; i < n; i++) x[i] = x[i] / sum;
                });
            },
            "softmax of");
    }
    SECTION("a RoPE table with frequencies 10000^(-j / head_size)") {
        kvlab::test::expect_failure(
            [] {
                const int hs = 2 * draw(1, 5), max_seq = draw(2, 99);
                kvlab::RopeTable wrong(max_seq, hs);
                for (int pos = 0; pos < max_seq; pos++)
                    for (int j = 0; j < wrong.n_pairs; j++) {
                        const float angle = float(pos) * (1.0f / std::pow(10000.0f, float(j) / float(hs)));
                        wrong.cos[std::size_t(pos) * wrong.n_pairs + j] = float(std::cos(double(angle)));
                        wrong.sin[std::size_t(pos) * wrong.n_pairs + j] = float(std::sin(double(angle)));
                    }
                check_rope_table(wrong, hs);
            },
            "RoPE table");
    }
    SECTION("exp_f32 two ulps high above 1") {
        kvlab::test::expect_failure(
            [] {
                exp_oracle([](float x) {
                    const float y = kvlab::exp_f32(x);
                    return x > 0 ? std::nextafter(std::nextafter(y, INFINITY), INFINITY) : y;
                });
            },
            "exp_f32(");
    }
}
