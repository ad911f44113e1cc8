// kvlab tests: the float64 reference forward, "the math as written on the board".
//
// It shares nothing with core/ but the weights' values (widened to double) and the config:
// its own RoPE angles (double, from theta = 10000), std::exp, plain sums. It is deliberately
// slow and literal: one position, one head, one matrix-vector product at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <vector>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "model.h"

namespace kvlab::ref {

using Vec = xt::xtensor<double, 1>;
using Mat = xt::xtensor<double, 2>;
using Ten3 = xt::xtensor<double, 3>;

// A float32 tensor, widened exactly to double, at an explicit row-major shape.
template <std::size_t N>
xt::xtensor<double, N> widen(std::span<const float> v, const std::array<std::size_t, N>& shape) {
    xt::xtensor<double, N> t(shape);
    if (t.size() != v.size()) throw std::logic_error("reference64: tensor size does not match its shape");
    for (std::size_t i = 0; i < v.size(); i++) t.data()[i] = double(v[i]);
    return t;
}

// Matrices [L][out][in] (core/model.h keeps a checkpoint's layout) widened as [L][in][out].
inline Ten3 widen_in_out(std::span<const float> v, std::size_t L, std::size_t n_out, std::size_t n_in) {
    const Ten3 t = widen<3>(v, {L, n_out, n_in});
    return xt::transpose(t, {0, 2, 1});
}

// y[out] = sum_i x[i] W[i, out]   (W held [in, out] here)
inline Vec matvec(const Vec& x, const Mat& W) { return xt::sum(xt::view(x, xt::all(), xt::newaxis()) * W, {0}); }

// x * w / sqrt(mean(x^2) + 1e-5)
inline Vec rmsnorm(const Vec& x, const Vec& w) {
    const double mean_sq = xt::mean(x * x)();
    return w * x / std::sqrt(mean_sq + 1e-5);
}

// e^s / sum e^s, shifted by the max only to keep exp in range (the result is the same).
inline Vec softmax(const Vec& s) {
    const Vec e = xt::exp(s - xt::amax(s)());  // std::exp on each double
    return e / xt::sum(e)();
}

// silu(a) = a / (1 + e^-a)
inline Vec silu(const Vec& a) { return a / (1.0 + xt::exp(-a)); }

// Rotates each head of v [n_heads * head_size] at position pos: pair (2j, 2j+1) by the angle
// pos * theta^(-2j / head_size); with an odd head_size the last element of a head stays.
inline Vec rope(Vec v, double pos, int head_size) {
    const double theta = 10000.0;
    for (std::size_t base = 0; base < v.size(); base += std::size_t(head_size))
        for (int j = 0; j < head_size / 2; j++) {
            const double angle = pos * std::pow(theta, -2.0 * j / head_size);
            const double c = std::cos(angle), s = std::sin(angle);
            double& v0 = v(base + 2 * j);
            double& v1 = v(base + 2 * j + 1);
            const double r0 = v0 * c - v1 * s, r1 = v0 * s + v1 * c;
            v0 = r0;
            v1 = r1;
        }
    return v;
}

// Conditioning: how much the forward (Reference64::forward) amplifies small relative errors of its intermediate
// values (rounding errors of a float32 run, say), as a factor >= 1 tracked alongside the values.
// A model of typical errors, not a worst case: an error of relative size e in a vector z is
// taken to point in a random direction, so a linear map W moves W z by about
// e ||z|| ||W||_F / sqrt(n_in). Each factor is clamped at 1 so that a fresh rounding error made
// at any step is amplified no more than the running factor says. It is large only where values
// cancel: a residual stream x + o much shorter than x and o, a product x W much shorter than
// ||x|| ||W|| suggests, scores large enough to make softmax sharp, logits near 0.
struct Gain {
    // k carried through a step of gain c; a fresh rounding error at the step counts 1.
    static double amp(double k, double c) { return std::max(1.0, k * c); }
    static double norm(const Vec& v) { return std::sqrt(xt::sum(v * v)()); }
    // y = x W
    static double matvec(const Vec& x, const Mat& W, const Vec& y) {
        return norm(x) * std::sqrt(xt::sum(W * W)() / double(W.shape(0))) / norm(y);
    }
    // z = x + o, where x and o carry conditioning kx and ko (independent errors add in quadrature).
    static double add(double kx, const Vec& x, double ko, const Vec& o, const Vec& z) {
        return std::max(1.0, std::hypot(kx * norm(x), ko * norm(o)) / norm(z));
    }
    // g = silu(h1) * h3, elementwise: first-order terms silu'(h1) h3 dh1 + silu(h1) dh3.
    static double silu_mul(double k1, const Vec& h1, double k3, const Vec& h3, const Vec& g) {
        const double n = double(h1.size());
        const Vec sig = 1.0 / (1.0 + xt::exp(-h1));
        const Vec dsilu = sig * (1.0 + h1 * (1.0 - sig));
        const double e1 = k1 * norm(h1) / std::sqrt(n) * norm(dsilu * h3);
        const double e3 = k3 * norm(h3) / std::sqrt(n) * norm(h1 * sig);
        return std::max(1.0, std::hypot(e1, e3) / norm(g));
    }
    // One head's out = sum_s p_s v_s, p = softmax(q k_s / sqrt(hs)), where q, row k_s and row v_s
    // carry conditioning kq, kk[s], kv[s]: returns the squared size of out's error. Score s moves
    // by about hypot(kq, kk[s]) ||q|| ||k_s|| / hs (a random error projected on hs dimensions,
    // then scaled by 1/sqrt(hs)), p_s by p_s times that, and since the p_s sum to 1 their change
    // weighs v_s - out. Large scores make softmax sharp and this large.
    static double attention_head(double kq, const Vec& kk, const Vec& kv, const Vec& q, const Mat& K, const Mat& V,
                                 const Vec& p, const Vec& out) {
        const double hs = double(q.size());
        const Vec knorm = xt::sqrt(xt::sum(K * K, {1}));                        // [t+1]
        const Vec vnorm = xt::sqrt(xt::sum(V * V, {1}));                        // [t+1]
        const Vec dev = xt::sqrt(xt::sum(xt::square(V - out), {1}));            // [t+1]
        const Vec dscore = xt::sqrt(kq * kq + kk * kk) * norm(q) * knorm / hs;  // [t+1]
        const double from_p = norm(p * dscore * dev), from_v = norm(p * kv * vnorm);
        return from_p * from_p + from_v * from_v;
    }
    // logits = xb wcls, with the error measured as max_v |dl_v| / max(1, max_v |l_v|).
    static double classifier(const Vec& xb, const Mat& wcls, const Vec& logits) {
        const double max_col = std::sqrt(xt::amax(xt::sum(wcls * wcls, {0}))());
        const double scale = std::max(1.0, xt::amax(xt::abs(logits))());
        return norm(xb) * max_col / std::sqrt(double(xb.size())) / scale;
    }
};

struct Reference64 {
    Config c;
    Mat token_embedding;  // [vocab, dim]
    Mat rms_att;          // [L, dim]
    Ten3 wq;              // [L, dim, dim]         (in, out): widened from the model's (out, in)
    Ten3 wk;              // [L, dim, kv_dim]      (in, out)
    Ten3 wv;              // [L, dim, kv_dim]      (in, out)
    Ten3 wo;              // [L, dim, dim]         (in, out)
    Mat rms_ffn;          // [L, dim]
    Ten3 w1;              // [L, dim, hidden]      (in, out)
    Ten3 w2;              // [L, hidden, dim]      (in, out)
    Ten3 w3;              // [L, dim, hidden]      (in, out)
    Vec rms_final;        // [dim]
    Mat wcls;             // [dim, vocab]          (in, out)

    // The model's [out][in] matrices are widened as [in][out], the textbook x W.
    explicit Reference64(const Weights& w) : c(w.config) {
        const std::size_t L = c.n_layers, dim = c.dim, kv = c.kv_dim(), hid = c.hidden_dim, vocab = c.vocab_size;
        token_embedding = widen<2>(w.token_embedding, {vocab, dim});
        rms_att = widen<2>(w.rms_att, {L, dim});
        wq = widen_in_out(w.wq, L, dim, dim);
        wk = widen_in_out(w.wk, L, kv, dim);
        wv = widen_in_out(w.wv, L, kv, dim);
        wo = widen_in_out(w.wo, L, dim, dim);
        rms_ffn = widen<2>(w.rms_ffn, {L, dim});
        w1 = widen_in_out(w.w1, L, hid, dim);
        w2 = widen_in_out(w.w2, L, dim, hid);
        w3 = widen_in_out(w.w3, L, hid, dim);
        rms_final = widen<1>(w.rms_final, {dim});
        wcls = xt::view(widen_in_out(w.wcls, 1, vocab, dim), 0, xt::all(), xt::all());
    }

    // Logits [vocab] of the last of tokens. query_pos_shift rotates every query as if it sat
    // that many positions later (keys stay put): a deliberate bug for the counter-test, since
    // shifting queries and keys together would change nothing (RoPE is relative).
    // kappa, when given, receives the conditioning estimate described at Gain below.
    Vec forward(std::span<const int> tokens, int query_pos_shift = 0, double* kappa = nullptr) const {
        const auto amp = Gain::amp;
        const int T = int(tokens.size()), hs = c.head_size(), group = c.group();
        const std::size_t dim = c.dim, kv_dim = c.kv_dim();
        using xt::all, xt::range, xt::view;

        Mat x({std::size_t(T), dim});  // residual stream, one row per position
        for (int t = 0; t < T; t++) view(x, t, all()) = view(token_embedding, tokens[t], all());
        std::vector<double> kx(T, 1.0);  // conditioning of each row of x (the embedding is exact)

        for (int l = 0; l < c.n_layers; l++) {
            const Mat Wq = view(wq, l), Wk = view(wk, l), Wv = view(wv, l), Wo = view(wo, l);
            const Mat W1 = view(w1, l), W2 = view(w2, l), W3 = view(w3, l);

            // q [T, dim], k and v [T, kv_dim]: every position's projections, RoPE at its position.
            Mat q({std::size_t(T), dim}), k({std::size_t(T), kv_dim}), v({std::size_t(T), kv_dim});
            // Their conditioning [T]. (Vec kq({T}) would be one element holding T, hence the array.)
            const std::array<std::size_t, 1> rows{std::size_t(T)};
            Vec kq(rows), kk(rows), kv(rows);
            for (int t = 0; t < T; t++) {
                const Vec xb = rmsnorm(view(x, t, all()), view(rms_att, l, all()));
                const Vec qt = matvec(xb, Wq), kt = matvec(xb, Wk), vt = matvec(xb, Wv);
                view(q, t, all()) = rope(qt, t + query_pos_shift, hs);
                view(k, t, all()) = rope(kt, t, hs);
                view(v, t, all()) = vt;
                // conditioning
                kq(t) = amp(kx[t], Gain::matvec(xb, Wq, qt));
                kk(t) = amp(kx[t], Gain::matvec(xb, Wk, kt));
                kv(t) = amp(kx[t], Gain::matvec(xb, Wv, vt));
            }

            // Causal attention: position t, query head h reads KV head h / group over 0..t.
            Mat att({std::size_t(T), dim});
            std::vector<double> katt(T);  // its conditioning
            for (int t = 0; t < T; t++) {
                double err2 = 0;  // conditioning: squared size of att[t]'s propagated error
                for (int h = 0; h < c.n_heads; h++) {
                    auto qcols = range(h * hs, (h + 1) * hs);
                    auto kvcols = range((h / group) * hs, (h / group + 1) * hs);
                    const Vec qh = view(q, t, qcols);                                  // [hs]
                    const Mat Kh = view(k, range(0, t + 1), kvcols);                   // [t+1, hs]
                    const Mat Vh = view(v, range(0, t + 1), kvcols);                   // [t+1, hs]
                    const Vec scores = xt::sum(Kh * qh, {1}) / std::sqrt(double(hs));  // [t+1]
                    const Vec p = softmax(scores);
                    const Vec out = xt::sum(view(p, all(), xt::newaxis()) * Vh, {0});  // [hs]
                    view(att, t, qcols) = out;
                    err2 += Gain::attention_head(kq(t), view(kk, range(0, t + 1)), view(kv, range(0, t + 1)), qh, Kh,
                                                 Vh, p, out);
                }
                katt[t] = std::max(1.0, std::sqrt(err2) / Gain::norm(view(att, t, all())));
            }

            // Residuals: x += att Wo;  x += W2 (silu(W1 xb) * W3 xb), xb = rmsnorm(x).
            for (int t = 0; t < T; t++) {
                const Vec a = view(att, t, all());
                const Vec o = matvec(a, Wo);
                const Vec x1 = view(x, t, all()) + o;
                const Vec xb = rmsnorm(x1, view(rms_ffn, l, all()));
                const Vec h1 = matvec(xb, W1), h3 = matvec(xb, W3), g = silu(h1) * h3;
                const Vec o2 = matvec(g, W2);
                const Vec x2 = x1 + o2;
                // conditioning (rmsnorm is scale-invariant: xb inherits x1's)
                const double kx1 = Gain::add(kx[t], view(x, t, all()), amp(katt[t], Gain::matvec(a, Wo, o)), o, x1);
                const double kg =
                    Gain::silu_mul(amp(kx1, Gain::matvec(xb, W1, h1)), h1, amp(kx1, Gain::matvec(xb, W3, h3)), h3, g);
                kx[t] = Gain::add(kx1, x1, amp(kg, Gain::matvec(g, W2, o2)), o2, x2);
                view(x, t, all()) = x2;
            }
        }
        const Vec xb = rmsnorm(view(x, T - 1, all()), rms_final);
        const Vec logits = matvec(xb, wcls);
        if (kappa) *kappa = amp(kx[T - 1], Gain::classifier(xb, wcls, logits));
        return logits;
    }
};

}  // namespace kvlab::ref
