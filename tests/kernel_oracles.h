// The kernels' float64 oracles: for each kernel, the textbook formula in float64 and an error bound
// derived from the kernel's own sequence of float32 operations. Each check takes a kernel's inputs
// and the outputs it produced, and fails the current property (property.h: kvlab::fail) naming
// the first element outside its bound. Shared by the backend table (tests/test_backend_ops.cpp,
// which runs every backend kernel against these) and tests/test_kernel_oracles.cpp (the kernels
// no backend reaches on its own: softmax on any row, exp_f32, the raw products).
//
// Why: the decoders share these kernels, so a kernel bug cancels out of every naive-versus-cached
// comparison (both paths compute the same wrong number, bit for bit). Only an independent oracle
// sees it. The inputs range over the whole domain, not typical values: magnitudes from subnormal
// to near overflow (hostile_vector), both zeros, ties, -inf scores, and odd sizes.
//
// Notation for the bounds (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-3):
//   u = 2^-24            float32's unit roundoff: one rounding to nearest has relative error <= u
//   gamma(n) = n u / (1 - n u)   bound on the relative error of n roundings in sequence
//   tiny = 2^-149        the smallest subnormal: a rounding that underflows errs by <= tiny / 2
// A sum of n products computed left to right, sum_k x_k w_k, errs by at most
// gamma(n) * sum_k |x_k w_k| (+ n tiny for underflowing products). The float64 oracle's own
// error (gamma(n) with u = 2^-53) is added where it is not negligible.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model.h"
#include "property.h"

namespace kvlab::oracle {

constexpr double u = 0x1p-24;
constexpr double u64 = 0x1p-53;
constexpr double tiny = 0x1p-149;

inline double gamma(int n) { return n * u / (1 - n * u); }
inline double gamma64(int n) { return n * u64 / (1 - n * u64); }

// A vector from anywhere in float's domain: a scale 2^e0 with e0 in [lo_exp, hi_exp) for the
// whole vector (so some vectors are all subnormal, some all huge), entries within 2^-24 .. 1 of
// it, random signs, and now and then a zero of either sign or a copy of an earlier entry (a tie).
// draw(lo, hi) returns an integer in [lo, hi], both included: RapidCheck's (property.h: draw) in
// a property, a seeded generator in the backend table (whose cases replay from their seed).
template <class Draw>
std::vector<float> hostile_vector(Draw&& draw, std::int64_t n, int lo_exp, int hi_exp) {
    const int e0 = draw(lo_exp, hi_exp - 1);
    std::vector<float> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));  // [n]
    for (std::size_t i = 0; i < v.size(); i++) {
        const int kind = draw(0, 18);  // 1 in 19 a zero, 1 in 19 a tie
        if (kind == 0) {
            v[i] = draw(0, 1) ? 0.0f : -0.0f;
        } else if (kind == 1 && i > 0) {
            v[i] = v[std::size_t(draw(0, int(i) - 1))];
        } else {
            const double mantissa = 1.0 + double(draw(0, (1 << 23) - 1)) * 0x1p-23;
            const double x = std::ldexp(mantissa, e0 - draw(0, 24));
            v[i] = float(draw(0, 1) ? x : -x);
        }
    }
    return v;
}

inline std::string show(std::span<const float> v) {
    std::string s;
    for (float x : v) s += fmt::format("{}{:a}", s.empty() ? "" : " ", x);
    return "[" + s + "]";
}

// ---- matmul: Y[r][o] = sum_k X[r][k] W[k][o], k ascending from +0. x: [rows, ldx], w: [n_in, ldw],
// y: [rows, ldy].
inline void check_matmul(const float* x, int ldx, const float* w, int ldw, const float* y, int ldy, int rows, int n_in,
                         int n_out) {
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            double exact = 0, magnitude = 0;
            for (int k = 0; k < n_in; k++) {
                const double p = double(x[std::int64_t(r) * ldx + k]) * double(w[std::int64_t(k) * ldw + o]);
                exact += p;
                magnitude += std::fabs(p);
            }
            const double bound = (gamma(n_in) + gamma64(n_in)) * magnitude + n_in * tiny;
            const double got = y[std::int64_t(r) * ldy + o];
            if (!(std::fabs(got - exact) <= bound))
                kvlab::fail(fmt::format("matmul Y[{}][{}] = {:a}, the float64 sum is {:a}, bound {:.3g}", r, o, got,
                                        exact, bound));
        }
}

// ---- softmax: p_i = e^(x_i - max) / sum_j e^(x_j - max).
// The kernel computes d_i = fl(x_i - max) (relative error u), e_i = exp_f32(d_i) (within 1 ulp,
// 2u relative, so e_i = e^(d_i) * e^(delta |d_i|) * (1 +- 2u), delta <= u), sums the e_i from +0
// (all non-negative: relative gamma(n)) and divides (u). Hence, with r_i the relative error of
// e_i and R the largest r_j:
//   |p_i' - p_i| <= ((1 + r_i)(1 + u) / ((1 - R)(1 - gamma(n))) - 1) p_i + 2 tiny
// Scores below max - 110 have e^d < 2^-158: exp_f32 gives exactly +0 (its cut-off is -103.97),
// and -inf gives exactly +0 too; both are checked bit for bit.
inline void check_softmax(std::span<const float> x, std::span<const float> p) {
    const int n = int(x.size());
    double max = -std::numeric_limits<double>::infinity();
    for (float v : x) max = std::max(max, double(v));
    std::vector<double> d(x.size()), e(x.size());  // [n]
    double sum = 0, R = 0;
    auto rel = [](double di) { return std::exp(std::fabs(di) * (u + u64)) * (1 + 2 * u) - 1; };
    for (int i = 0; i < n; i++) {
        d[i] = double(x[i]) - max;  // exact for these floats' exponents, but counted in rel anyway
        e[i] = std::exp(d[i]);
        sum += e[i];
        if (d[i] >= -110) R = std::max(R, rel(d[i]));
    }
    for (int i = 0; i < n; i++) {
        if (d[i] < -110) {
            if (std::bit_cast<std::uint32_t>(p[i]) != 0u)
                kvlab::fail(
                    fmt::format("softmax of {} : entry {} (x - max = {:.4g}) is {:a}, not +0", show(x), i, d[i], p[i]));
            continue;
        }
        const double want = e[i] / sum;
        const double bound = ((1 + rel(d[i])) * (1 + u) / ((1 - R) * (1 - gamma(n) - gamma64(n))) - 1) * want +
                             n * std::exp(-110.0) * want + 3 * tiny;
        if (!(std::fabs(double(p[i]) - want) <= bound))
            kvlab::fail(fmt::format("softmax of {} : p[{}] = {:a}, the float64 value is {:a}, bound {:.3g}", show(x), i,
                                    p[i], want, bound));
    }
}

// ---- rmsnorm: out_j = w_j (s x_j), s = 1 / sqrt(sum_j x_j^2 / dim + 1e-5); x, out: [rows, dim], w: [dim].
// sum_j x_j^2: relative gamma(dim) (non-negative terms), then / dim, + eps (whose float value
// is within u of 1e-5), sqrt (u), 1 / (u): s within gamma(dim) / 2 + 4u; then two products (2u).
// Underflowing squares and products add absolute errors of a few tiny.
inline void check_rmsnorm(const float* x, const float* w, const float* out, int rows, int dim) {
    for (int r = 0; r < rows; r++) {
        const float* xr = x + std::int64_t(r) * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += double(xr[j]) * double(xr[j]);
        const double s = 1 / std::sqrt(ss / dim + 1e-5);
        const double rel = 1.01 * (gamma(dim) / 2 + 6 * u) + gamma64(dim);
        for (int j = 0; j < dim; j++) {
            const double want = double(w[j]) * (s * double(xr[j]));
            // Squares that underflow lose at most dim tiny / 2 of the sum; through s (whose derivative
            // is at most (1e-5)^-1.5 / (2 dim)) that moves out_j by under 1e7 |w_j x_j| tiny.
            const double wx = std::fabs(double(w[j]) * double(xr[j]));
            const double bound = rel * std::fabs(want) + (std::fabs(double(w[j])) + 1) * tiny + 1e7 * wx * tiny;
            const double got = out[std::int64_t(r) * dim + j];
            if (!(std::fabs(got - want) <= bound))
                kvlab::fail(
                    fmt::format("rmsnorm row {} of {} : out[{}] = {:a}, the float64 value is {:a}, bound {:.3g}", r,
                                show(std::span<const float>(xr, std::size_t(dim))), j, got, want, bound));
        }
    }
}

// ---- silu_mul: h_j = a_j (1 / (1 + e^-a_j)) b_j; a, b, h: [n].
// e^-a from exp_f32 (2u relative; the negation is exact), 1 + e (u, and the 2u of e scaled by
// e / (1 + e) <= 1), 1 / (u), two products (2u): 6u in all, 7u with second-order terms. Where
// e^-a overflows (a < -88.72) the kernel gives +-0 while the true value is below |a b| e^a.
inline void check_silu_mul(const float* a, const float* b, const float* h, std::int64_t n) {
    for (std::int64_t j = 0; j < n; j++) {
        const double aj = a[j], bj = b[j];
        const double want = aj / (1 + std::exp(-aj)) * bj;
        double bound = 7 * u * std::fabs(want) + (std::fabs(bj) + 2) * tiny;
        if (aj < -88.0) bound += std::fabs(aj * bj) * std::exp(aj) * 1.01;
        if (!(std::fabs(double(h[j]) - want) <= bound))
            kvlab::fail(fmt::format("silu_mul(a = {:a}, b = {:a}) = {:a}, the float64 value is {:a}, bound {:.3g}",
                                    a[j], b[j], h[j], want, bound));
    }
}

// ---- The RoPE table: cos and sin of angle = pos * 10000^(-2j / head_size), computed as
// llama2.c does in float: the exponent 2j / head_size (u), powf (glibc: under 1 ulp, 2u; and the
// rounded exponent moves the power by ln(10000) |y| u <= 9.22u), 1 / (u), pos * freq (u): the
// angle is within 13.22u |angle| (13.5u with second-order terms), and so are its cos and sin,
// plus the final rounding to float (u).
inline void check_rope_table(const RopeTable& table, int head_size) {
    for (int pos = 0; pos < table.max_seq; pos++)
        for (int j = 0; j < table.n_pairs; j++) {
            const double angle = pos * std::pow(10000.0, -2.0 * j / head_size);
            const double bound = 13.5 * u * std::fabs(angle) + u;
            const double c = table.cos[std::size_t(pos) * table.n_pairs + j];
            const double s = table.sin[std::size_t(pos) * table.n_pairs + j];
            if (!(std::fabs(c - std::cos(angle)) <= bound && std::fabs(s - std::sin(angle)) <= bound))
                kvlab::fail(
                    fmt::format("RoPE table at pos {}, pair {} (head_size {}): cos {:.9g}, sin {:.9g}; the "
                                "float64 values are {:.9g}, {:.9g}, bound {:.3g}",
                                pos, j, head_size, c, s, std::cos(angle), std::sin(angle), bound));
        }
}

// ---- rope: each pair (v0, v1) of each head becomes (v0 c - v1 s, v0 s + v1 c) with the table's
// c and s at the row's position: two products and a sum, |error| <= gamma(2)(|v0 c| + |v1 s|)
// (+ 2 tiny); with an odd head_size the last element of a head is left exactly as it was.
// v (before) and out (after): [rows, n_heads * head_size]; positions: [rows].
inline void check_rope(const float* v, const float* out, int rows, int n_heads, int head_size,
                       std::span<const int> positions, const RopeTable& table) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_heads; h++) {
            const std::size_t base = (std::size_t(r) * n_heads + h) * head_size;
            for (int j = 0; j < head_size / 2; j++) {
                const double c = table.cos[std::size_t(positions[r]) * table.n_pairs + j];
                const double s = table.sin[std::size_t(positions[r]) * table.n_pairs + j];
                const double v0 = v[base + 2 * j], v1 = v[base + 2 * j + 1];
                const double want0 = v0 * c - v1 * s, want1 = v0 * s + v1 * c;
                const double bound0 = gamma(2) * (std::fabs(v0 * c) + std::fabs(v1 * s)) + 2 * tiny;
                const double bound1 = gamma(2) * (std::fabs(v0 * s) + std::fabs(v1 * c)) + 2 * tiny;
                if (!(std::fabs(out[base + 2 * j] - want0) <= bound0 &&
                      std::fabs(out[base + 2 * j + 1] - want1) <= bound1))
                    kvlab::fail(
                        fmt::format("rope row {} (pos {}), head {}, pair {}: ({:a}, {:a}) became ({:a}, {:a}); "
                                    "the float64 rotation is ({:a}, {:a})",
                                    r, positions[r], h, j, v[base + 2 * j], v[base + 2 * j + 1], out[base + 2 * j],
                                    out[base + 2 * j + 1], want0, want1));
            }
            if (head_size % 2 == 1 && std::bit_cast<std::uint32_t>(out[base + head_size - 1]) !=
                                          std::bit_cast<std::uint32_t>(v[base + head_size - 1]))
                kvlab::fail(fmt::format("rope changed the unpaired last element of head {} of row {}", h, r));
        }
}

// ---- attention_row: scores s_t = (q . k_t) / sqrt(head_size), p = softmax(s), out = sum_t p_t v_t.
// A score errs by at most D_t = (gamma(hs) sum_d |q_d k_td| + hs tiny) / sqrt(hs) + 2u |s_t|
// (the dot, then the rounded sqrt (u/2) and the division (u)). Moving every score by at most D
// moves each p_t by a factor within e^(+-2D); the softmax itself adds the error bounded above.
// Then sum_t p_t' v_td errs by gamma(n) sum_t p_t' |v_td| + sum_t |p_t' - p_t| |v_td| (+ n tiny).
// q, out: [hs]; key(t), value(t): the hs floats of position t; probe (null, or [n]): the weights
// p_t' the kernel computed, each within its bound |p_t' - p_t| too. `where` names the row and head.
template <class Key, class Value>
void check_attention_row(const float* q, int hs, int n, Key key, Value value, const float* out, const float* probe,
                         std::string_view where) {
    std::vector<double> s(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));  // [n]
    double D = 0, max = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < n; t++) {
        const float* k = key(t);
        double dot = 0, magnitude = 0;
        for (int d = 0; d < hs; d++) {
            dot += double(q[d]) * double(k[d]);
            magnitude += std::fabs(double(q[d]) * double(k[d]));
        }
        s[t] = dot / std::sqrt(double(hs));
        D = std::max(D, ((gamma(hs) + gamma64(hs)) * magnitude + hs * tiny) / std::sqrt(double(hs)) * (1 + 3 * u) +
                            2 * u * std::fabs(s[t]));
        max = std::max(max, s[t]);
    }
    double sum = 0, R = 0;
    auto rel = [&](double dt) { return std::exp((std::fabs(dt) + 2 * D) * (u + u64)) * (1 + 2 * u) - 1; };
    for (int t = 0; t < n; t++) {
        p[t] = std::exp(s[t] - max);
        sum += p[t];
        R = std::max(R, rel(s[t] - max));
    }
    std::vector<double> p_err(static_cast<std::size_t>(n));  // [n] bounds on |p_t' - p_t|
    for (int t = 0; t < n; t++) {
        p[t] /= sum;
        const double rho = (1 + rel(s[t] - max)) * (1 + u) / ((1 - R) * (1 - gamma(n) - gamma64(n))) - 1;
        p_err[t] = p[t] * ((1 + rho) * std::exp(2 * D) - 1) + 2 * tiny;
        if (probe && !(std::fabs(double(probe[t]) - p[t]) <= p_err[t]))
            kvlab::fail(
                fmt::format("attention_row ({}, head_size {}, n {}): weight p[{}] = {:a}, the float64 value is "
                            "{:a}, bound {:.3g}",
                            where, hs, n, t, probe[t], p[t], p_err[t]));
    }
    for (int d = 0; d < hs; d++) {
        double want = 0, bound = n * tiny;
        for (int t = 0; t < n; t++) {
            const double vt = value(t)[d];
            want += p[t] * vt;
            bound += p_err[t] * std::fabs(vt) + (gamma(n) + gamma64(n)) * (p[t] + p_err[t]) * std::fabs(vt);
        }
        if (!(std::fabs(double(out[d]) - want) <= bound))
            kvlab::fail(
                fmt::format("attention_row ({}, head_size {}, n {}): out[{}] = {:a}, the float64 value is {:a}, "
                            "bound {:.3g}",
                            where, hs, n, d, out[d], want, bound));
    }
}

// ---- add: one rounding, so the oracle is exact. x + y in double is exact for two floats
// (53 >= 2 * 24 + 2 bits: rounding it to float is the correctly rounded sum). x, y, out: [n].
inline void check_add(const float* x, const float* y, const float* out, std::int64_t n) {
    for (std::int64_t i = 0; i < n; i++) {
        const float want = float(double(x[i]) + double(y[i]));
        if (std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(want))
            kvlab::fail(
                fmt::format("add({:a}, {:a}) = {:a}, the correctly rounded sum is {:a}", x[i], y[i], out[i], want));
    }
}

// ---- token_logprob: (x_t - max) - ln S, S = sum_j e^(x_j - max) over n logits (a vocabulary, up
// to 32000). The max is exact (comparisons). d_j = fl(x_j - max) errs by u |d_j|, and
// e_j = exp_f32(d_j) is within 1 ulp (2u relative), so e_j = e^(d_j) (1 + rho_j) with
// |rho_j| <= r_j = e^(|d_j| (u + u64)) (1 + 2u) - 1; where e_j is subnormal or flushed to +0
// (d < -87.3) it errs by at most 2^-149 instead. The sum runs left to right from +0: addition k
// errs by at most u times its exact result (Higham 4.2), which is at most the exact partial sum
// s_k = sum_{j<=k} e^(d_j) times (1 + R)(1 + gamma(n)) / (1 - u), R = max r_j. So
//   |S' - S| <= E = sum_j r_j e^(d_j) + u (1 + R)(1 + gamma(n)) / (1 - u) sum_{k=2..n} s_k + 2n 2^-149,
// whose middle term is the length's: about n u S when every partial sum is near S (the maximum
// first), less when it comes last. Then |ln S' - ln S| <= -ln(1 - E / S) =: D; log_f32 is within
// 2 ulp (4u |ln S'|); fl(x_t - max) errs by u |x_t - max|, the last subtraction by u |result|.
// The float64 reference errs by under (gamma64(n) + 4 u64)(1 + |ln S| + |x_t - max|).
inline void check_token_logprob(std::span<const float> x, int token, float got) {
    const int n = int(x.size());
    double max = x[0];
    for (float v : x) max = std::max(max, double(v));
    double S = 0, partial_sums = 0, weighted_r = 0, R = 0;
    for (int j = 0; j < n; j++) {
        const double d = double(x[std::size_t(j)]) - max, e = std::exp(d);
        const double r = std::exp(std::fabs(d) * (u + u64)) * (1 + 2 * u) - 1;
        S += e;
        if (j > 0) partial_sums += S;
        if (d >= -87.3) weighted_r += r * e, R = std::max(R, r);
    }
    const double E = weighted_r + u * (1 + R) * (1 + gamma(n)) / (1 - u) * partial_sums + 2.0 * n * tiny;
    const double D = -std::log1p(-E / S);
    const double a = double(x[std::size_t(token)]) - max, lnS = std::log(S), want = a - lnS;
    const double pre = u * std::fabs(a) + D + 4 * u * (std::fabs(lnS) + D);
    const double bound =
        pre + u * (std::fabs(want) + pre) + (gamma64(n) + 4 * u64) * (1 + std::fabs(lnS) + std::fabs(a));
    if (!(std::fabs(double(got) - want) <= bound))
        kvlab::fail(
            fmt::format("token_logprob of token {} of {} logits (max {:a}, S {:.6g}): {:a}, the float64 value "
                        "is {:a}, bound {:.3g}",
                        token, n, max, S, got, want, bound));
}

// ---- argmax: the first index of the largest of n logits (greedy decoding's token); exact.
inline void check_argmax(std::span<const float> x, int got) {
    int want = 0;
    for (int i = 1; i < int(x.size()); i++)
        if (x[std::size_t(i)] > x[std::size_t(want)]) want = i;
    if (got != want)
        kvlab::fail(fmt::format("argmax of {} logits is {} ({:a}), the first index of the largest is {} ({:a})",
                                x.size(), got, got >= 0 && got < int(x.size()) ? x[std::size_t(got)] : 0.0f, want,
                                x[std::size_t(want)]));
}

}  // namespace kvlab::oracle
