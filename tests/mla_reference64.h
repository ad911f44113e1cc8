// kvlab tests: MLA (core/mla.h) in double, from the formulas in mla.h and the order of operations
// kernels.h states for each kernel (nothing of mla.cpp's code), with a first-order bound on how far
// the float computation of one form can be from each logit.
//
// The derivation. Each float operation rounds its exact result z to z (1 + d), |d| <= u = 2^-24
// for +, -, *, / and sqrt, 3u for exp_f32 (within 1 ulp of the correctly rounded e^x,
// tests/test_kernels.cpp, so 1.5 ulp of e^x). Perturbing operation k's result by r_k moves a
// logit L by dL/dz_k r_k to first order, so
//   |L_float - L| <= sum_k |dL/dz_k| rho_k,   rho_k = u |z_k| (3u |z_k| for exp),
// where dL/dz_k is the derivative through every later operation. The reference records each
// operation of the form on a tape (its value, its inputs' partial derivatives, rho_k) and gets
// every dL/dz_k with one reverse sweep per logit. So a small row, which RMSNorm divides by as
// little as sqrt(1e-5), and a sum whose terms are much larger than its result enter with the
// derivatives they have. (A bound carried forward instead, |dy| <= |J| |dx| step by step, multiplies absolute
// Jacobians, |J2| |J1| >= |J2 J1|, and grows by a factor of a few per step: after two layers it
// was as large as the logits.)
//
// What it leaves out is second order: each term times the relative size of the perturbations,
// below 1e-3 for these models (the largest bound drawn is 7e-4 of logits of order 1); and the
// double's own rounding, the same sum with 2^-53 for u: 2^-29 of the bound.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "mla.h"

namespace kvlab::mla_ref {

inline constexpr double kU = 0x1p-24;  // float's unit roundoff

// Every float operation of one run, in order: node k's inputs (-1: an exact input, a weight, an
// embedding, a table entry), its partial derivatives by them, and rho_k.
struct Tape {
    struct Node {
        std::int32_t in[2];
        double d[2];
        double rho;
    };
    std::vector<Node> nodes;
    std::vector<double> adj;  // [nodes]: the sweep's dL/dz_k

    // sum_k |dL/dz_k| rho_k for L = node out: one reverse sweep (node k's inputs come before it).
    double bound(std::int32_t out) {
        adj.assign(std::size_t(out) + 1, 0.0);
        adj[std::size_t(out)] = 1.0;
        double b = 0;
        for (std::int32_t k = out; k >= 0; k--) {
            const double a = adj[std::size_t(k)];
            if (a == 0) continue;
            const Node& n = nodes[std::size_t(k)];
            b += std::fabs(a) * n.rho;
            for (int j = 0; j < 2; j++)
                if (n.in[j] >= 0) adj[std::size_t(n.in[j])] += a * n.d[j];
        }
        return b;
    }
};

// A value in real arithmetic and the node that computed it; id -1: an exact input.
struct Var {
    double v = 0;
    std::int32_t id = -1;
    Tape* tape = nullptr;
};

inline Var record(Var a, double da, Var b, double db, double v, double rho) {
    Tape* t = a.tape ? a.tape : b.tape;
    assert(t != nullptr);
    t->nodes.push_back({{a.id, b.id}, {da, db}, rho});
    return {v, std::int32_t(t->nodes.size() - 1), t};
}
inline Var operator+(Var a, Var b) { return record(a, 1, b, 1, a.v + b.v, kU * std::fabs(a.v + b.v)); }
inline Var operator-(Var a, Var b) { return record(a, 1, b, -1, a.v - b.v, kU * std::fabs(a.v - b.v)); }
inline Var operator-(Var a) { return record(a, -1, {}, 0, -a.v, 0); }  // exact
inline Var operator*(Var a, Var b) { return record(a, b.v, b, a.v, a.v * b.v, kU * std::fabs(a.v * b.v)); }
inline Var operator/(Var a, Var b) {
    const double q = a.v / b.v;
    return record(a, 1 / b.v, b, -q / b.v, q, kU * std::fabs(q));
}
inline Var sqrt(Var a) {
    const double s = std::sqrt(a.v);
    return record(a, 0.5 / s, {}, 0, s, kU * s);
}
// exp_f32: 3u relative; a subnormal result, or a flushed 0, is off by at most 2^-149 more.
inline Var exp(Var a) {
    const double e = std::exp(a.v);
    return record(a, e, {}, 0, e, 3 * kU * e + 0x1p-149);
}
// Adds rho to the rounding of x's node: a float step that computes a little more than x's formula.
inline Var widen(Var x, double rho) {
    x.tape->nodes[std::size_t(x.id)].rho += rho;
    return x;
}

using Row = std::vector<Var>;
inline Var exact(float w) { return {double(w)}; }

// sum_k a(k) b(k) over k = 0..n-1 in order, as every kernel sums: 0 + the first product is exact.
template <class A, class B>
Var dot(int n, A a, B b) {
    Var s = a(0) * b(0);
    for (int k = 1; k < n; k++) s = s + a(k) * b(k);
    return s;
}

// A weight as an input: a float taken as exact, or a Var (a rounded weight, latent_weights).
inline Var weight(const float* w, std::size_t i) { return exact(w[i]); }
inline Var weight(const Var* w, std::size_t i) { return w[i]; }

// y [n_out] = x [n_in] W, W[k][o] = w[k * in_stride + o * out_stride] (matmul's sum in k order).
template <class W>
Row product(const Row& x, const W* w, int n_in, int n_out, int in_stride, int out_stride = 1) {
    Row y(static_cast<std::size_t>(n_out));
    for (int o = 0; o < n_out; o++)
        y[std::size_t(o)] = dot(
            n_in, [&](int k) { return x[std::size_t(k)]; },
            [&](int k) { return weight(w, std::size_t(k) * in_stride + std::size_t(o) * out_stride); });
    return y;
}

// The latent's weights W_DKV, W_UK, W_UV as the reference reads them. Exact inputs, or (rounded)
// each a node of its own with rho = u |w|: the weight is the float rounding of a real one
// (truncate_rank's products, computed in double and stored in float). One node per weight, so
// its rounding is the same perturbation wherever the weight is read.
struct LatentWeights {
    std::vector<Var> wdkv, wuk, wuv;
};

inline LatentWeights latent_weights(const MlaModel& m, Tape& tape, bool rounded) {
    auto read = [&](const std::vector<float>& w) {
        std::vector<Var> out;
        out.reserve(w.size());
        for (float x : w) {
            if (!rounded) {
                out.push_back(exact(x));
                continue;
            }
            tape.nodes.push_back({{-1, -1}, {0, 0}, kU * std::fabs(double(x))});
            out.push_back({double(x), std::int32_t(tape.nodes.size() - 1), &tape});
        }
        return out;
    };
    return {read(m.wdkv), read(m.wuk), read(m.wuv)};
}

// y [n] = x [n] w / sqrt(mean(x^2) + 1e-5) in rmsnorm's order: 1 / sqrt(ss / n + eps), then
// w (r x). The float adds 1e-5f, not 1e-5: that difference joins the add's rounding.
inline Row norm(const Row& x, const float* w) {
    const int n = int(x.size());
    Var ss = dot(
        n, [&](int k) { return x[std::size_t(k)]; }, [&](int k) { return x[std::size_t(k)]; });
    ss = widen(ss / Var{double(n)} + Var{1e-5}, std::fabs(1e-5 - double(1e-5f)));
    const Var r = Var{1.0} / sqrt(ss);
    Row y(x.size());
    for (int j = 0; j < n; j++) y[std::size_t(j)] = exact(w[j]) * (r * x[std::size_t(j)]);
    return y;
}

// Rotates row[first .. first + rope_dim) at pos by the model's cos and sin table (exact inputs).
inline void rotate(Row& row, std::size_t first, int rope_dim, int pos, const RopeTable& rope) {
    for (int j = 0; j < rope_dim / 2; j++) {
        const Var c = exact(rope.cos[std::size_t(pos) * (rope_dim / 2) + j]),
                  s = exact(rope.sin[std::size_t(pos) * (rope_dim / 2) + j]);
        Var& a = row[first + std::size_t(2 * j)];
        Var& b = row[first + std::size_t(2 * j + 1)];
        const Var a2 = a * c - b * s, b2 = a * s + b * c;
        a = a2, b = b2;
    }
}

// p [n] = softmax(s [n]): e^(s_i - max), summed in order, each divided by the sum. The max is
// taken as exact: softmax is the same for any shift, so only the subtractions' rounding counts.
inline Row softmax(const Row& s) {
    double top = s[0].v;
    for (const Var& x : s) top = std::max(top, x.v);
    Row e(s.size());
    for (std::size_t i = 0; i < s.size(); i++) e[i] = exp(s[i] - Var{top});
    Var sum = e[0];
    for (std::size_t i = 1; i < s.size(); i++) sum = sum + e[i];
    for (Var& x : e) x = x / sum;
    return e;
}

// One layer's rows at every position t: qc[t] [n_heads * head_size], qr[t] [n_heads * rope_dim]
// (rotated), c[t] [rank], kr[t] [rope_dim] (rotated); rebuild also k[t], v[t] [n_heads * head_size].
struct LayerRows {
    std::vector<Row> qc, qr, c, kr, k, v;
};

inline LayerRows layer_rows(const MlaModel& m, const LatentWeights& lw, MlaForm form, int l,
                            const std::vector<Row>& x) {
    const MlaConfig& mc = m.config;
    const int dim = mc.base.dim, wide = mc.base.n_heads * mc.head_size(), dr = mc.rope_dim, r = mc.rank;
    const std::size_t L = std::size_t(l);
    LayerRows rows;
    for (std::size_t t = 0; t < x.size(); t++) {
        const Row xb = norm(x[t], m.rms_att.data() + L * dim);
        rows.qc.push_back(product(xb, m.wq.data() + L * dim * wide, dim, wide, wide));
        rows.qr.push_back(product(xb, m.wqr.data() + L * dim * mc.base.n_heads * dr, dim, mc.base.n_heads * dr,
                                  mc.base.n_heads * dr));
        rows.c.push_back(product(xb, lw.wdkv.data() + L * dim * r, dim, r, r));
        rows.kr.push_back(product(xb, m.wkr.data() + L * dim * dr, dim, dr, dr));
        for (int h = 0; h < mc.base.n_heads; h++) rotate(rows.qr.back(), std::size_t(h) * dr, dr, int(t), m.rope);
        rotate(rows.kr.back(), 0, dr, int(t), m.rope);
        if (form == MlaForm::rebuild) {  // K_C and V of every head, rebuilt from the latent
            rows.k.push_back(product(rows.c.back(), lw.wuk.data() + L * r * wide, r, wide, wide));
            rows.v.push_back(product(rows.c.back(), lw.wuv.data() + L * r * wide, r, wide, wide));
        }
    }
    return rows;
}

// Head h's output [head_size] for the query at position i, over positions 0..i, in `form`:
//   rebuild   score_t = [q_C ; q_R] . [k_C(t) ; k_R(t)] / scale,  out = sum_t p_t v(t)
//   absorbed  q~ = W_UK_h q_C [rank], score_t = [q~ ; q_R] . [c_t ; k_R(t)] / scale,
//             out = (sum_t p_t c_t) W_UV_h
// The float's scale is sqrt(width) correctly rounded, u off the real one: u |score| more.
inline Row head(const MlaModel& m, const LatentWeights& lw, MlaForm form, int l, int h, int i, const LayerRows& rows,
                double scale) {
    const MlaConfig& mc = m.config;
    const int hs = mc.head_size(), dr = mc.rope_dim, r = mc.rank, wide = mc.base.n_heads * hs;
    // W_UK_h and W_UV_h [rank, head_size]: head h's columns of W_UK, W_UV [rank, n_heads * head_size]
    const Var* wuk = lw.wuk.data() + std::size_t(l) * r * wide + std::size_t(h) * hs;
    const Var* wuv = lw.wuv.data() + std::size_t(l) * r * wide + std::size_t(h) * hs;
    const Row& qc = rows.qc[std::size_t(i)];
    const Row& qr = rows.qr[std::size_t(i)];
    const std::size_t c0 = std::size_t(h) * hs, r0 = std::size_t(h) * dr;  // head h's columns
    const std::size_t n = std::size_t(i) + 1;
    Row q;  // [head_size + rope_dim] or [rank + rope_dim]: the query the scores read
    if (form == MlaForm::rebuild) {
        q.assign(qc.begin() + std::ptrdiff_t(c0), qc.begin() + std::ptrdiff_t(c0 + hs));
    } else {
        for (int j = 0; j < r; j++)
            q.push_back(dot(
                hs, [&](int e) { return qc[c0 + std::size_t(e)]; },
                [&](int e) { return wuk[std::size_t(j) * wide + e]; }));
    }
    q.insert(q.end(), qr.begin() + std::ptrdiff_t(r0), qr.begin() + std::ptrdiff_t(r0 + dr));
    const int front = int(q.size()) - dr;  // head_size or rank: where the RoPE part starts
    Row s(n);                              // [i + 1]
    for (std::size_t t = 0; t < n; t++) {
        const Var d = dot(
            int(q.size()), [&](int e) { return q[std::size_t(e)]; },
            [&](int e) {
                if (e >= front) return rows.kr[t][std::size_t(e - front)];
                return form == MlaForm::rebuild ? rows.k[t][c0 + std::size_t(e)] : rows.c[t][std::size_t(e)];
            });
        const Var x = d / Var{scale};
        s[t] = widen(x, kU * std::fabs(x.v));
    }
    const Row p = softmax(s);
    auto weighted = [&](int width, auto value) {  // sum_t p_t value(t, e) [width], in t order
        Row out(static_cast<std::size_t>(width));
        for (int e = 0; e < width; e++)
            out[std::size_t(e)] = dot(
                int(n), [&](int t) { return p[std::size_t(t)]; }, [&](int t) { return value(t, e); });
        return out;
    };
    if (form == MlaForm::rebuild)
        return weighted(hs, [&](int t, int e) { return rows.v[std::size_t(t)][c0 + std::size_t(e)]; });
    const Row lat = weighted(r, [&](int t, int j) { return rows.c[std::size_t(t)][std::size_t(j)]; });
    return product(lat, wuv, r, hs, wide);
}

// The last position's logits [vocab_size] in real arithmetic, and per logit the bound on `form`'s
// float computation of them.
struct Logits {
    std::vector<double> v, bound;
};

// MLA over tokens, every position recomputed, in `form`'s order of operations. planted_scale:
// scores divided by sqrt(head_size), the scale of a head without its RoPE part (a counter-test's
// bug; the bound is left as it is). rounded_latent: the bound also covers the rounding of each
// latent weight (latent_weights), for a model whose latent weights are float roundings of real ones.
inline Logits mla_reference64(const MlaModel& m, std::span<const int> tokens, MlaForm form, bool planted_scale = false,
                              bool rounded_latent = false) {
    const MlaConfig& mc = m.config;
    const int dim = mc.base.dim, H = mc.base.n_heads, hs = mc.head_size(), hid = mc.base.hidden_dim;
    Tape tape;
    const LatentWeights lw = latent_weights(m, tape, rounded_latent);
    std::vector<Row> x(tokens.size(), Row(static_cast<std::size_t>(dim)));  // [T][dim] residual rows
    for (std::size_t t = 0; t < tokens.size(); t++)
        for (int e = 0; e < dim; e++)
            x[t][std::size_t(e)] = {double(m.token_embedding[std::size_t(tokens[t]) * dim + e]), -1, &tape};
    const double scale = std::sqrt(double(planted_scale ? hs : hs + mc.rope_dim));
    for (int l = 0; l < mc.base.n_layers; l++) {
        const std::size_t L = std::size_t(l);
        const LayerRows rows = layer_rows(m, lw, form, l, x);
        for (std::size_t i = 0; i < x.size(); i++) {
            Row att;  // [n_heads * head_size]
            for (int h = 0; h < H; h++) {
                const Row o = head(m, lw, form, l, h, int(i), rows, scale);
                att.insert(att.end(), o.begin(), o.end());
            }
            const Row o = product(att, m.wo.data() + L * H * hs * dim, H * hs, dim, dim);
            for (int e = 0; e < dim; e++) x[i][std::size_t(e)] = x[i][std::size_t(e)] + o[std::size_t(e)];
            const Row xb = norm(x[i], m.rms_ffn.data() + L * dim);
            Row h1 = product(xb, m.w1.data() + L * dim * hid, dim, hid, hid);
            const Row h3 = product(xb, m.w3.data() + L * dim * hid, dim, hid, hid);
            for (int e = 0; e < hid; e++) {  // silu_mul: a (1 / (1 + e^-a)), times h3
                const Var a = h1[std::size_t(e)];
                h1[std::size_t(e)] = (a * (Var{1.0} / (Var{1.0} + exp(-a)))) * h3[std::size_t(e)];
            }
            const Row f = product(h1, m.w2.data() + L * hid * dim, hid, dim, dim);
            for (int e = 0; e < dim; e++) x[i][std::size_t(e)] = x[i][std::size_t(e)] + f[std::size_t(e)];
        }
    }
    // The classifier is the embedding [vocab_size, dim] read as [dim, vocab_size].
    const Row logits =
        product(norm(x.back(), m.rms_final.data()), m.token_embedding.data(), dim, mc.base.vocab_size, 1, dim);
    Logits out;
    for (const Var& z : logits) out.v.push_back(z.v), out.bound.push_back(tape.bound(z.id));
    return out;
}

}  // namespace kvlab::mla_ref
