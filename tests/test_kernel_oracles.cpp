// Every kernel against an oracle of its own: the textbook formula in float64, and an error bound
// derived from the kernel's own sequence of float32 operations.
//
// Why: the decoders share these kernels, so a kernel bug cancels out of every naive-versus-cached
// comparison (both paths compute the same wrong number, bit for bit). Only an independent oracle
// sees it. The inputs range over the whole domain, not typical values: magnitudes from subnormal
// to near overflow, both zeros, ties, -inf scores, and odd sizes. Each oracle has a counter-test:
// a planted kernel bug that it must catch.
//
// Notation for the bounds (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 2-3):
//   u = 2^-24            float32's unit roundoff: one rounding to nearest has relative error <= u
//   gamma(n) = n u / (1 - n u)   bound on the relative error of n roundings in sequence
//   tiny = 2^-149        the smallest subnormal: a rounding that underflows errs by <= tiny / 2
// A sum of n products computed left to right, sum_k x_k w_k, errs by at most
// gamma(n) * sum_k |x_k w_k| (+ n tiny for underflowing products). The float64 oracle's own
// error (gamma(n) with u = 2^-53) is added where it is not negligible.
#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels.h"
#include "property.h"
#include "test_util.h"

using kvlab::Exec;
using kvlab::test::full_range;

namespace {

constexpr double u = 0x1p-24;
constexpr double u64 = 0x1p-53;
constexpr double tiny = 0x1p-149;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

double gamma(int n) { return n * u / (1 - n * u); }
double gamma64(int n) { return n * u64 / (1 - n * u64); }

// A vector from anywhere in float's domain: a scale 2^e0 with e0 in [lo_exp, hi_exp] for the
// whole vector (so some vectors are all subnormal, some all huge), entries within 2^-24 .. 1 of
// it, random signs, and now and then a zero of either sign or a copy of an earlier entry (a tie).
std::vector<float> hostile_vector(int n, int lo_exp, int hi_exp) {
    const int e0 = *full_range(lo_exp, hi_exp);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; i++) {
        const int kind = *full_range(0, 19);
        if (kind == 0) {
            v[i] = *full_range(0, 1) ? 0.0f : -0.0f;
        } else if (kind == 1 && i > 0) {
            v[i] = v[std::size_t(*full_range(0, i - 1))];
        } else {
            const double mantissa = 1.0 + double(*full_range(0, (1 << 23) - 1)) * 0x1p-23;
            const double x = std::ldexp(mantissa, e0 - *full_range(0, 24));
            v[i] = float(*full_range(0, 1) ? x : -x);
        }
    }
    return v;
}

std::string show(const std::vector<float>& v) {
    std::string s;
    for (float x : v) s += fmt::format("{}{:a}", s.empty() ? "" : " ", x);
    return "[" + s + "]";
}

// ---- matmul: Y[r][o] = sum_k X[r][k] W[k][o], k ascending from +0.
void matmul_oracle(kvlab::MatmulFn mm) {
    const int rows = *full_range(1, 3), n_in = *full_range(0, 40), n_out = *full_range(1, 9);
    // Scales up to 2^55: products below 2^112, sums of 40 of them far below float's 2^128.
    const std::vector<float> x = hostile_vector(rows * n_in, -149, 55);
    const std::vector<float> w = hostile_vector(n_in * n_out, -149, 55);
    std::vector<float> y(std::size_t(rows) * n_out, -1.0f);
    Exec ex;
    mm(ex, y.data(), n_out, x.data(), n_in, w.data(), n_out, rows, n_in, n_out);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            double exact = 0, magnitude = 0;
            for (int k = 0; k < n_in; k++) {
                const double p = double(x[std::size_t(r) * n_in + k]) * double(w[std::size_t(k) * n_out + o]);
                exact += p;
                magnitude += std::fabs(p);
            }
            const double bound = (gamma(n_in) + gamma64(n_in)) * magnitude + n_in * tiny;
            const double got = y[std::size_t(r) * n_out + o];
            if (!(std::fabs(got - exact) <= bound))
                kvlab::fail(fmt::format("matmul Y[{}][{}] = {:a}, the float64 sum is {:a}, bound {:.3g}", r, o, got, exact,
                                        bound));
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
using SoftmaxFn = std::function<void(float*, int)>;

void check_softmax(const std::vector<float>& x, const std::vector<float>& p) {
    const int n = int(x.size());
    double max = -std::numeric_limits<double>::infinity();
    for (float v : x) max = std::max(max, double(v));
    std::vector<double> d(x.size()), e(x.size());
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
                kvlab::fail(fmt::format("softmax of {} : entry {} (x - max = {:.4g}) is {:a}, not +0", show(x), i, d[i],
                                        p[i]));
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

void softmax_oracle(const SoftmaxFn& softmax) {
    const int n = *full_range(1, 40);
    // Scores from subnormal to 2^100 (far past exp's range, so a kernel that forgets to subtract
    // the maximum overflows), with -inf (masked) entries; entry 0 stays finite, as in a causal row.
    std::vector<float> x = hostile_vector(n, -149, 100);
    for (int i = 1; i < n; i++)
        if (*full_range(0, 3) == 0) x[i] = neg_inf;
    std::vector<float> p = x;
    softmax(p.data(), n);
    check_softmax(x, p);
}

// ---- rmsnorm: out_j = w_j (s x_j), s = 1 / sqrt(sum_j x_j^2 / dim + 1e-5).
// sum_j x_j^2: relative gamma(dim) (non-negative terms), then / dim, + eps (whose float value
// is within u of 1e-5), sqrt (u), 1 / (u): s within gamma(dim) / 2 + 4u; then two products (2u).
// Underflowing squares and products add absolute errors of a few tiny.
using RmsnormFn = std::function<void(Exec&, float*, const float*, const float*, int, int)>;

void rmsnorm_oracle(const RmsnormFn& rmsnorm) {
    const int rows = *full_range(1, 3), dim = *full_range(1, 64);
    // Whole rows of subnormals (where eps dominates) up to 2^55 (squares below 2^112).
    const std::vector<float> x = hostile_vector(rows * dim, -149, 55);
    const std::vector<float> w = hostile_vector(dim, -20, 10);
    std::vector<float> out(x.size(), -1.0f);
    Exec ex;
    rmsnorm(ex, out.data(), x.data(), w.data(), rows, dim);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += double(x[std::size_t(r) * dim + j]) * double(x[std::size_t(r) * dim + j]);
        const double s = 1 / std::sqrt(ss / dim + 1e-5);
        const double rel = 1.01 * (gamma(dim) / 2 + 6 * u) + gamma64(dim);
        for (int j = 0; j < dim; j++) {
            const double want = double(w[j]) * (s * double(x[std::size_t(r) * dim + j]));
            // Squares that underflow lose at most dim tiny / 2 of the sum; through s (whose derivative
            // is at most (1e-5)^-1.5 / (2 dim)) that moves out_j by under 1e7 |w_j x_j| tiny.
            const double wx = std::fabs(double(w[j]) * double(x[std::size_t(r) * dim + j]));
            const double bound = rel * std::fabs(want) + (std::fabs(double(w[j])) + 1) * tiny + 1e7 * wx * tiny;
            const double got = out[std::size_t(r) * dim + j];
            if (!(std::fabs(got - want) <= bound))
                kvlab::fail(fmt::format("rmsnorm row {} of {} : out[{}] = {:a}, the float64 value is {:a}, bound {:.3g}", r,
                                        show(std::vector<float>(x.begin() + r * dim, x.begin() + (r + 1) * dim)), j,
                                        got, want, bound));
        }
    }
}

// ---- silu_mul: h_j = a_j (1 / (1 + e^-a_j)) b_j.
// e^-a from exp_f32 (2u relative; the negation is exact), 1 + e (u, and the 2u of e scaled by
// e / (1 + e) <= 1), 1 / (u), two products (2u): 6u in all, 7u with second-order terms. Where
// e^-a overflows (a < -88.72) the kernel gives +-0 while the true value is below |a b| e^a.
using SiluFn = std::function<void(Exec&, float*, const float*, std::int64_t)>;

void silu_oracle(const SiluFn& silu_mul) {
    const int n = *full_range(1, 64);
    const std::vector<float> a = hostile_vector(n, -149, 11);  // up to 4096: exp overflows either way
    const std::vector<float> b = hostile_vector(n, -149, 40);
    std::vector<float> h = a;
    Exec ex;
    silu_mul(ex, h.data(), b.data(), n);
    for (int j = 0; j < n; j++) {
        const double aj = a[j], bj = b[j];
        const double want = aj / (1 + std::exp(-aj)) * bj;
        double bound = 7 * u * std::fabs(want) + (std::fabs(bj) + 2) * tiny;
        if (aj < -88.0) bound += std::fabs(aj * bj) * std::exp(aj) * 1.01;
        if (!(std::fabs(double(h[j]) - want) <= bound))
            kvlab::fail(fmt::format("silu_mul(a = {:a}, b = {:a}) = {:a}, the float64 value is {:a}, bound {:.3g}", a[j],
                                    b[j], h[j], want, bound));
    }
}

// ---- The RoPE table: cos and sin of angle = pos * 10000^(-2j / head_size), computed as
// llama2.c does in float: the exponent 2j / head_size (u), powf (glibc: under 1 ulp, 2u; and the
// rounded exponent moves the power by ln(10000) |y| u <= 9.22u), 1 / (u), pos * freq (u): the
// angle is within 13.22u |angle| (13.5u with second-order terms), and so are its cos and sin,
// plus the final rounding to float (u).
void check_rope_table(const kvlab::RopeTable& table, int head_size) {
    for (int pos = 0; pos < table.max_seq; pos++)
        for (int j = 0; j < table.n_pairs; j++) {
            const double angle = pos * std::pow(10000.0, -2.0 * j / head_size);
            const double bound = 13.5 * u * std::fabs(angle) + u;
            const double c = table.cos[std::size_t(pos) * table.n_pairs + j];
            const double s = table.sin[std::size_t(pos) * table.n_pairs + j];
            if (!(std::fabs(c - std::cos(angle)) <= bound && std::fabs(s - std::sin(angle)) <= bound))
                kvlab::fail(fmt::format("RoPE table at pos {}, pair {} (head_size {}): cos {:.9g}, sin {:.9g}; the float64 "
                                        "values are {:.9g}, {:.9g}, bound {:.3g}",
                                        pos, j, head_size, c, s, std::cos(angle), std::sin(angle), bound));
        }
}

// ---- rope: each pair (v0, v1) of each head becomes (v0 c - v1 s, v0 s + v1 c) with the table's
// c and s at the row's position: two products and a sum, |error| <= gamma(2)(|v0 c| + |v1 s|)
// (+ 2 tiny); with an odd head_size the last element of a head is left exactly as it was.
using RopeFn = std::function<void(Exec&, float*, int, int, int, std::span<const int>, const kvlab::RopeTable&)>;

void rope_oracle(const RopeFn& rope) {
    const int head_size = *full_range(1, 12), n_heads = *full_range(1, 3), rows = *full_range(1, 3);
    const int max_seq = *full_range(1, 300);
    const kvlab::RopeTable table(max_seq, head_size);
    check_rope_table(table, head_size);
    std::vector<int> positions(static_cast<std::size_t>(rows));
    for (int& p : positions) p = *full_range(0, max_seq - 1);
    const std::vector<float> v = hostile_vector(rows * n_heads * head_size, -149, 100);
    std::vector<float> out = v;
    Exec ex;
    rope(ex, out.data(), rows, n_heads, head_size, positions, table);
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
                if (!(std::fabs(out[base + 2 * j] - want0) <= bound0 && std::fabs(out[base + 2 * j + 1] - want1) <= bound1))
                    kvlab::fail(fmt::format("rope row {} (pos {}), head {}, pair {}: ({:a}, {:a}) became ({:a}, {:a}); the "
                                            "float64 rotation is ({:a}, {:a})",
                                            r, positions[r], h, j, v[base + 2 * j], v[base + 2 * j + 1], out[base + 2 * j],
                                            out[base + 2 * j + 1], want0, want1));
            }
            if (head_size % 2 == 1 &&
                std::bit_cast<std::uint32_t>(out[base + head_size - 1]) != std::bit_cast<std::uint32_t>(v[base + head_size - 1]))
                kvlab::fail(fmt::format("rope changed the unpaired last element of head {} of row {}", h, r));
        }
}

// ---- attention_row: scores s_t = (q . k_t) / sqrt(head_size), p = softmax(s), out = sum_t p_t v_t.
// A score errs by at most D_t = (gamma(hs) sum_d |q_d k_td| + hs tiny) / sqrt(hs) + 2u |s_t|
// (the dot, then the rounded sqrt (u/2) and the division (u)). Moving every score by at most D
// moves each p_t by a factor within e^(+-2D); the softmax itself adds the error bounded above.
// Then sum_t p_t' v_td errs by gamma(n) sum_t p_t' |v_td| + sum_t |p_t' - p_t| |v_td| (+ n tiny).
using AttentionFn = std::function<void(float* out, const float* q, int head_size, int n, const float* k,
                                       const float* v, float* scores)>;

void attention_oracle(const AttentionFn& attention) {
    const int hs = *full_range(1, 16), n = *full_range(1, 24);
    const std::vector<float> q = hostile_vector(hs, -60, 12);
    const std::vector<float> k = hostile_vector(n * hs, -60, 12);  // [n, hs]
    const std::vector<float> v = hostile_vector(n * hs, -149, 60);  // [n, hs]
    std::vector<float> out(static_cast<std::size_t>(hs), -1.0f), scores(static_cast<std::size_t>(n));
    attention(out.data(), q.data(), hs, n, k.data(), v.data(), scores.data());
    std::vector<double> s(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));
    double D = 0, max = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < n; t++) {
        double dot = 0, magnitude = 0;
        for (int d = 0; d < hs; d++) {
            dot += double(q[d]) * double(k[std::size_t(t) * hs + d]);
            magnitude += std::fabs(double(q[d]) * double(k[std::size_t(t) * hs + d]));
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
    std::vector<double> p_err(static_cast<std::size_t>(n));
    for (int t = 0; t < n; t++) {
        p[t] /= sum;
        const double rho = (1 + rel(s[t] - max)) * (1 + u) / ((1 - R) * (1 - gamma(n) - gamma64(n))) - 1;
        p_err[t] = p[t] * ((1 + rho) * std::exp(2 * D) - 1) + 2 * tiny;
    }
    for (int d = 0; d < hs; d++) {
        double want = 0, bound = n * tiny;
        for (int t = 0; t < n; t++) {
            const double vt = v[std::size_t(t) * hs + d];
            want += p[t] * vt;
            bound += p_err[t] * std::fabs(vt) + (gamma(n) + gamma64(n)) * (p[t] + p_err[t]) * std::fabs(vt);
        }
        if (!(std::fabs(double(out[d]) - want) <= bound))
            kvlab::fail(fmt::format("attention_row (head_size {}, n {}): out[{}] = {:a}, the float64 value is {:a}, "
                                    "bound {:.3g}",
                                    hs, n, d, out[d], want, bound));
    }
}

void kvlab_attention(float* out, const float* q, int hs, int n, const float* k, const float* v, float* scores) {
    kvlab::attention_row(
        out, q, hs, n, [&](int t) { return k + std::size_t(t) * hs; }, [&](int t) { return v + std::size_t(t) * hs; },
        scores);
}

// ---- add and exp_f32: one rounding each, so the oracle is exact. x + y in double is exact for
// two floats (53 >= 2 * 24 + 2 bits: rounding it to float is the correctly rounded sum).
using AddFn = std::function<void(Exec&, float*, const float*, std::int64_t)>;

void add_oracle(const AddFn& add) {
    const int n = *full_range(1, 32);
    const std::vector<float> x = hostile_vector(n, -149, 127), y = hostile_vector(n, -149, 127);
    std::vector<float> out = x;
    Exec ex;
    add(ex, out.data(), y.data(), n);
    for (int i = 0; i < n; i++) {
        const float want = float(double(x[i]) + double(y[i]));
        if (std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(want))
            kvlab::fail(fmt::format("add({:a}, {:a}) = {:a}, the correctly rounded sum is {:a}", x[i], y[i], out[i], want));
    }
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

TEST_CASE("kernel oracles: rmsnorm, silu_mul and add against float64", "[kernels][oracle]") {
    rc::prop("rmsnorm vs float64", [] { rmsnorm_oracle(kvlab::rmsnorm); });
    rc::prop("silu_mul vs float64", [] { silu_oracle(kvlab::silu_mul); });
    rc::prop("add is the correctly rounded sum", [] { add_oracle(kvlab::add); });
}

TEST_CASE("kernel oracles: the RoPE table and rope against float64 rotations", "[kernels][oracle]") {
    rc::prop("rope vs float64", [] { rope_oracle(kvlab::rope); });
}

TEST_CASE("kernel oracles: attention_row against float64 attention", "[kernels][oracle]") {
    rc::prop("attention_row vs float64", [] { attention_oracle(kvlab_attention); });
}

TEST_CASE("kernel oracles: exp_f32 within 1 ulp for every float whose e^x is normal", "[kernels][oracle]") {
    rc::prop("exp_f32 vs float64", [] { exp_oracle([](float x) { return kvlab::exp_f32(x); }); });
}

TEST_CASE("kernel oracles counter-test: a planted bug in each kernel is caught by its oracle",
          "[kernels][oracle][counter]") {
    SECTION("matmul that drops the last term") {
        kvlab::test::expect_failure([] {
            matmul_oracle([](Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                             int n_in, int n_out) {
                kvlab::matmul_reference(ex, y, ldy, x, ldx, w, ldw, rows, n_in > 0 ? n_in - 1 : 0, n_out);
            });
        }, "matmul Y");
    }
    SECTION("softmax that does not subtract the maximum (overflows on large scores)") {
        kvlab::test::expect_failure([] {
            softmax_oracle([](float* x, int n) {
                float sum = 0;
                for (int i = 0; i < n; i++) sum = sum + (x[i] = kvlab::exp_f32(x[i]));
                for (int i = 0; i < n; i++) x[i] = x[i] / sum;
            });
        }, "softmax of");
    }
    SECTION("softmax whose sum skips the last entry") {
        kvlab::test::expect_failure([] {
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
        }, "softmax of");
    }
    SECTION("rmsnorm with epsilon 1e-6 (visible only on rows of tiny values)") {
        kvlab::test::expect_failure([] {
            rmsnorm_oracle([](Exec&, float* out, const float* x, const float* w, int rows, int dim) {
                for (int r = 0; r < rows; r++) {
                    float ss = 0;
                    for (int j = 0; j < dim; j++) ss = ss + x[r * dim + j] * x[r * dim + j];
                    const float s = 1.0f / std::sqrt(ss / float(dim) + 1e-6f);
                    for (int j = 0; j < dim; j++) out[r * dim + j] = w[j] * (s * x[r * dim + j]);
                }
            });
        }, "rmsnorm row");
    }
    SECTION("silu with e^a instead of e^-a") {
        kvlab::test::expect_failure([] {
            silu_oracle([](Exec&, float* h1, const float* h3, std::int64_t n) {
                for (std::int64_t i = 0; i < n; i++) h1[i] = h1[i] * (1.0f / (1.0f + kvlab::exp_f32(h1[i]))) * h3[i];
            });
        }, "silu_mul(");
    }
    SECTION("rope that reads the table at pos + 1") {
        kvlab::test::expect_failure([] {
            rope_oracle([](Exec& ex, float* vec, int rows, int n_heads, int hs, std::span<const int> positions,
                           const kvlab::RopeTable& table) {
                std::vector<int> shifted(positions.begin(), positions.end());
                for (int& p : shifted) p = std::min(p + 1, table.max_seq - 1);
                kvlab::rope(ex, vec, rows, n_heads, hs, shifted, table);
            });
        }, "rope row");
    }
    SECTION("a RoPE table with frequencies 10000^(-j / head_size)") {
        kvlab::test::expect_failure([] {
            const int hs = 2 * *full_range(1, 6), max_seq = *full_range(2, 100);
            kvlab::RopeTable wrong(max_seq, hs);
            for (int pos = 0; pos < max_seq; pos++)
                for (int j = 0; j < wrong.n_pairs; j++) {
                    const float angle = float(pos) * (1.0f / std::pow(10000.0f, float(j) / float(hs)));
                    wrong.cos[std::size_t(pos) * wrong.n_pairs + j] = float(std::cos(double(angle)));
                    wrong.sin[std::size_t(pos) * wrong.n_pairs + j] = float(std::sin(double(angle)));
                }
            check_rope_table(wrong, hs);
        }, "RoPE table");
    }
    SECTION("attention without the 1 / sqrt(head_size) scale") {
        kvlab::test::expect_failure([] {
            attention_oracle([](float* out, const float* q, int hs, int n, const float* k, const float* v, float* scores) {
                std::vector<float> q_scaled(q, q + hs);
                for (float& x : q_scaled) x = x * std::sqrt(float(hs));  // cancels the kernel's division
                kvlab_attention(out, q_scaled.data(), hs, n, k, v, scores);
            });
        }, "attention_row");
    }
    SECTION("add that rounds through a 16-bit significand") {
        kvlab::test::expect_failure([] {
            add_oracle([](Exec&, float* x, const float* y, std::int64_t n) {
                for (std::int64_t i = 0; i < n; i++) {
                    const float s = x[i] + y[i];
                    x[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(s) & 0xffffff00u);
                }
            });
        }, "add(");
    }
    SECTION("exp_f32 two ulps high above 1") {
        kvlab::test::expect_failure([] {
            exp_oracle([](float x) {
                const float y = kvlab::exp_f32(x);
                return x > 0 ? std::nextafter(std::nextafter(y, INFINITY), INFINITY) : y;
            });
        }, "exp_f32(");
    }
}
