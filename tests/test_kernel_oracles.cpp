// The kernels no backend runs on their own, against their float64 oracles (tests/kernel_oracles.h):
// the raw products (kernels.cpp's tiled matmul, which naive attention's products run on, and
// matmul_reference), softmax on any row (-inf and far-out-of-range scores that attention never
// forms), exp_f32 anywhere, and the RoPE table checker. Each oracle has a counter-test: a planted
// bug that it must catch.
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
