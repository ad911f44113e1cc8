// kvlab gpu: the code each GPU thread runs, written once. nvcc compiles these functions for the
// device (gpu/cuda_backend.cu); g++ compiles the very same source for the host launcher
// (gpu/host_backend.cpp), which runs them over the whole grid on the CPU. Each keeps the CPU
// kernel's order of operations (core/kernels.h, NUMERICS.md), so the three agree bit for bit.
//
//   embed_element           one float of x[rows, dim]: a copy
//   matmul_element          one Y[r][o]: ((0 + x[r][0] w[o][0]) + x[r][1] w[o][1]) + ..., k ascending
//   rmsnorm_element         one out[r][j]: w[j] * (s * x[r][j]), s = 1 / sqrt(sum_j x^2 / dim + 1e-5),
//                           the sum over j ascending (each thread of a row recomputes the same s)
//   rope_pair               one (2j, 2j+1) pair: (v0 c - v1 s, v0 s + v1 c), tabled c and s
//   silu_mul_element        one h1[i]: (a * (1 / (1 + e^-a))) * h3[i]
//   add_element             one x[i] += y[i]
//   softmax_stats, _weight  kernels.cpp softmax without storing the row: max scanned from x[0],
//                           sum of exp_f32(x - max) in order, weight = e / sum (softmax_element
//                           runs them as an element kernel, for the tests)
//   causal_attention_head   one (row i, head h) of naive attention: scores over j = 0..T-1,
//                           (q.k)/scale for j <= i and -inf after, softmax, then P V
//                           summed over all T columns in order (masked ones add exact +0)
//   store_kv_element        one element of a row's K and V into its cache slot, in the cache's format
//   load_kv_element         and back: the element decoded to fp32 (the format-aware naive decode)
//   attention_head          one (row i, head h) of cached attention: kernels.h's attention_row
//                           over rows[i].n slots, read from device memory, in t order
//   attention_score_element, attention_softmax_row, attention_value_element
//                           the same attention for a step of a few rows, split: one score per
//                           thread, a softmax per (row, head), one output channel per thread
//   tiled_head              tiled attention (core/tiled_attention.h) of one (row, head), for
//                           both: a tile's scores in a local array, its weights, then each
//                           o_j[d] summed in t order and folded into the output
//   attention_tile_partial  flash-decoding of a one-row step: one (head, key tile)'s partial,
//   fold_tile_partials      then each head's partials folded in tile order
//
// The rules they keep: one thread owns its outputs and computes each of them whole; every sum
// runs in increasing index from +0.0f; no split sums, tree reductions or atomics; e^x is
// exp_f32 (numerics.h), sqrt and division are IEEE-rounded (nvcc: -prec-sqrt=true
// -prec-div=true), and nothing is fused into an FMA (g++: -ffp-contract=off, nvcc:
// -fmad=false; the PTX audit test checks the compiled code).
//
// A decode step's attention is split into three launches (scores, softmax, values) over a scores
// buffer allocated once, as the CPU runs a lane per key and a lane per channel. A longer step (a
// prefill, whose scores would not fit) runs one thread per (row, head): the softmax needs every
// score before any weight, so that thread recomputes each score when it needs it: the same
// operations on the same inputs give the same bits every time.
#pragma once

#include <cstdint>

#include "kv_format.h"
#include "numerics.h"
#include "tiled_attention.h"

namespace kvlab::gpu {

// The bits of the NaN a missing row reads (numerics.h kNaN, as a bit pattern for the device).
KVLAB_HD inline float nan_f32() { return float_from_bits(0x7fc00000u); }
KVLAB_HD inline float neg_inf_f32() { return float_from_bits(0xff800000u); }

// sqrt(float(head_size)), as kernels.h attention_scale computes it (correctly rounded).
KVLAB_HD inline float attention_scale(int head_size) { return sqrtf(float(head_size)); }

// x[r][j] = token_embedding[tokens[r]][j]; emb: [vocab_size, dim], x: [rows, dim].
KVLAB_HD inline void embed_element(float* x, const float* emb, const int* tokens, int dim, int r, int j) {
    x[std::int64_t(r) * dim + j] = emb[std::int64_t(tokens[r]) * dim + j];
}

// Y[r][o] of Y[rows, n_out] = X[rows, n_in] · W^T with W[n_out, n_in] (out, in: a checkpoint's
// layout, so the weights are used as loaded); row strides ldx, ldw. Each thread reads its own
// row of W front to back.
KVLAB_HD inline float matmul_element(const float* x, int ldx, const float* w, int ldw, int n_in, int r, int o) {
    const float* xr = x + std::int64_t(r) * ldx;
    const float* wo = w + std::int64_t(o) * ldw;
    float s = 0.0f;
    for (int k = 0; k < n_in; k++) s = s + xr[k] * wo[k];
    return s;
}

// out[r][j] of rmsnorm(x[rows, dim]) with weights w[dim], in kernels.cpp's order.
KVLAB_HD inline void rmsnorm_element(float* out, const float* x, const float* w, int dim, int r, int j) {
    const float* xr = x + std::int64_t(r) * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; i++) ss = ss + xr[i] * xr[i];
    ss = ss / float(dim);
    ss = ss + 1e-5f;
    ss = 1.0f / sqrtf(ss);
    out[std::int64_t(r) * dim + j] = w[j] * (ss * xr[j]);
}

// Pair j of head h of row r of vec[rows, n_heads * head_size], at logical position positions[r];
// cos, sin: [max_seq, n_pairs], n_pairs = head_size / 2 (an odd head's last element stays).
KVLAB_HD inline void rope_pair(float* vec, int n_heads, int head_size, const int* positions, const float* cos,
                               const float* sin, int n_pairs, int r, int h, int j) {
    const std::int64_t at = std::int64_t(positions[r]) * n_pairs + j;
    const float c = cos[at], s = sin[at];
    float* v = vec + (std::int64_t(r) * n_heads + h) * head_size;
    const float v0 = v[2 * j], v1 = v[2 * j + 1];
    v[2 * j] = v0 * c - v1 * s;
    v[2 * j + 1] = v0 * s + v1 * c;
}

KVLAB_HD inline void silu_mul_element(float* h1, const float* h3, std::int64_t i) {
    float a = h1[i];
    a = a * (1.0f / (1.0f + exp_f32(-a)));
    h1[i] = a * h3[i];
}

KVLAB_HD inline void add_element(float* x, const float* y, std::int64_t i) { x[i] = x[i] + y[i]; }

// The softmax of n scores score(t), as kernels.cpp softmax computes it, without storing them:
// max scanned from score(0), sum of exp_f32(score - max) in t order; weight(t) = e_t / sum.
struct SoftmaxStats {
    float max, sum;
};
template <class Score>
KVLAB_HD SoftmaxStats softmax_stats(int n, const Score& score) {
    float max = score(0);
    for (int t = 1; t < n; t++) {
        const float s = score(t);
        if (s > max) max = s;
    }
    float sum = 0.0f;
    for (int t = 0; t < n; t++) sum = sum + exp_f32(score(t) - max);
    return {max, sum};
}
KVLAB_HD inline float softmax_weight(float score, SoftmaxStats st) { return exp_f32(score - st.max) / st.sum; }

// out[t] = softmax(x[n])[t]: the building block above as an element kernel (tests run it
// against kernels.cpp softmax on extreme inputs).
KVLAB_HD inline void softmax_element(float* out, const float* x, int n, int t) {
    const SoftmaxStats st = softmax_stats(n, [x](int u) { return x[u]; });
    out[t] = softmax_weight(x[t], st);
}

// Tiled attention over keys t = 0..n-1 (core/tiled_attention.h, kernels.h tiled_attention_row):
// score(t) is (q . k_t) / scale, value(t, d) element d of v_t; tile <= AttentionSpec::kMaxTile.
// kernels.h computes a tile's o_j[d] for every d before folding, this loop one d at a time: the
// same operations on the same values, so the same bits.
template <class Score, class Value>
KVLAB_HD void tiled_head(float* out, int n, int tile, int head_size, const Score& score, const Value& value) {
    float e[AttentionSpec::kMaxTile];  // the tile's scores, then its weights
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    if (n <= 0) return;
    TileStats acc = tile_fold_start();
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int m = n - t0 < tile ? n - t0 : tile;
        for (int u = 0; u < m; u++) e[u] = score(t0 + u);
        const TileFold f = tile_fold(acc, tile_weights(e, m));
        for (int d = 0; d < head_size; d++) {
            float o = 0.0f;
            for (int u = 0; u < m; u++) o = o + e[u] * value(t0 + u, d);
            out[d] = tile_fold_o(out[d], o, f);
        }
        acc = f.next;
    }
    for (int d = 0; d < head_size; d++) out[d] = out[d] / acc.l;
}

// Naive attention, query row i of head h: q, att [T, dim]; k, v [T, kv_dim]; the head reads KV
// head kvh. S[i][j] = (q_i . k_j) / scale for j <= i, -inf after; P =
// softmax(S[i]); att_i = sum_j P[i][j] v_j over all j = 0..T-1 (CpuBackend::causal_attention
// multiplies P by V over the whole row, so the masked +0 products are added here too).
// tile > 0: tiled attention with that tile over keys 0..i instead (no mask: later keys are
// never visited).
KVLAB_HD inline void causal_attention_head(float* att, const float* q, const float* k, const float* v, int T, int dim,
                                           int kv_dim, int head_size, int kvh, int i, int h, int tile = 0) {
    const float scale = attention_scale(head_size);
    const int last = i;
    const float* qi = q + std::int64_t(i) * dim + h * head_size;
    auto score = [&](int j) {
        if (j > last) return neg_inf_f32();
        const float* kj = k + std::int64_t(j) * kv_dim + kvh * head_size;
        float s = 0.0f;
        for (int d = 0; d < head_size; d++) s = s + qi[d] * kj[d];
        return s / scale;
    };
    float* out = att + std::int64_t(i) * dim + h * head_size;
    if (tile > 0) {
        auto value = [&](int j, int d) { return v[std::int64_t(j) * kv_dim + kvh * head_size + d]; };
        return tiled_head(out, i + 1, tile, head_size, score, value);
    }
    const SoftmaxStats st = softmax_stats(T, score);
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    for (int j = 0; j < T; j++) {
        const float p = softmax_weight(score(j), st);
        const float* vj = v + std::int64_t(j) * kv_dim + kvh * head_size;
        for (int d = 0; d < head_size; d++) out[d] = out[d] + p * vj[d];
    }
}

// Row is backend.h's RowKV (a template, so that this header needs only numerics.h and
// kv_format.h): the row of (layer l, KV head h, slot s) is row l * layer_rows + h * head_rows + s
// of its k and of its v, head_size elements of its format each (row_bytes bytes).

// Element d of KV head h of row i's K and V (k, v: [rows, kv_dim]) into layer l at its write_slot,
// stored in the row's format with layer l's scales (kv_store_element: fp32 as it is, a narrower
// format as its code, an integer format with its group's range fitted from the row's inputs).
template <class Row>
KVLAB_HD void store_kv_element(const Row* rows, int l, const float* k, const float* v, int kv_dim, int head_size,
                               int i, int h, int d) {
    const Row& r = rows[i];
    const std::int64_t at = r.row(l, h, r.write_slot);
    const std::int64_t from = std::int64_t(i) * kv_dim + h * head_size;  // the head row's first input
    if (r.key_group)  // KIVI: the raw key goes to the residual until its group completes
        r.kivi_residual(l, h, int(r.write_slot), head_size)[d] = k[from + d];
    else
        kv_store_element(r.format, r.k_row(at), d, k + from, r.k_scale(l), r.group, head_size);
    kv_store_element(r.format, r.v_row(at), d, v + from, r.v_scale(l), r.group, head_size);
}

// The inverse: element d of KV head h of row i's stored K and V at its write_slot of layer l,
// decoded (kv_load) into k, v: [rows, kv_dim].
template <class Row>
KVLAB_HD void load_kv_element(const Row* rows, int l, float* k, float* v, int kv_dim, int head_size, int i, int h,
                              int d) {
    const Row& r = rows[i];
    const std::int64_t at = r.row(l, h, r.write_slot);
    const std::int64_t to = std::int64_t(i) * kv_dim + h * head_size + d;
    k[to] = r.key_group ? r.kivi_key(l, h, int(r.write_slot), head_size, d)
                        : kv_load(r.format, r.k_row(at), d, r.k_scale(l), r.group, head_size);
    v[to] = kv_load(r.format, r.v_row(at), d, r.v_scale(l), r.group, head_size);
}

// What one (row i, head h) of cached attention at layer l reads: element d of position t's K and V
// row, decoded from the storage's format (kv_load: exact; KIVI keys through kivi_key), a slot of
// -1 reading NaN; and position t's score (q_i . k_t) / scale, recomputed whenever it is needed.
template <class Row>
struct CachedHead {
    const Row& r;
    const std::int64_t* s;  // [max_n] the row's slots
    std::int64_t base;
    const float* qi;
    float scale, ks, vs;
    int l, kvh, head_size;
    KVLAB_HD CachedHead(const Row* rows, int l_, const std::int64_t* slots, int max_n, const int* kv_head,
                        const float* q, int dim, int head_size_, int i, int h)
        : r(rows[i]),
          s(slots + std::int64_t(i) * max_n),
          base(r.row(l_, kv_head[h], 0)),
          qi(q + std::int64_t(i) * dim + h * head_size_),
          scale(attention_scale(head_size_)),
          ks(r.k_scale(l_)),
          vs(r.v_scale(l_)),
          l(l_),
          kvh(kv_head[h]),
          head_size(head_size_) {}
    KVLAB_HD float key(int t, int d) const {
        if (s[t] < 0) return nan_f32();
        if (r.key_group) return r.kivi_key(l, kvh, int(s[t]), head_size, d);  // KIVI: slot = position
        return kv_load(r.format, r.k_row(base + s[t]), d, ks, r.group, head_size);
    }
    KVLAB_HD float value(int t, int d) const {
        return s[t] < 0 ? nan_f32() : kv_load(r.format, r.v_row(base + s[t]), d, vs, r.group, head_size);
    }
    KVLAB_HD float score(int t) const {
        float x = 0.0f;
        for (int d = 0; d < head_size; d++) x = x + qi[d] * key(t, d);
        return x / scale;
    }
};

// Cached attention, query row i of head h at layer l, exactly kernels.h attention_row: over
// t = 0..rows[i].n - 1 (read here, from the rows array: a captured graph replays with new
// counts), slot slots[i * max_n + t] (-1 reads NaN) of KV head kv_head[h]. q, att: [rows, dim].
// probe (when not null and i == probe_row): [n_heads, max_n] the softmax weights.
// tile > 0: tiled attention with that tile (the probe still gets the row's softmax weights).
template <class Row>
KVLAB_HD void attention_head(float* att, const float* q, const Row* rows, int l, const std::int64_t* slots, int max_n,
                             const int* kv_head, int dim, int head_size, int probe_row, float* probe, int i, int h,
                             int tile = 0) {
    const CachedHead<Row> head(rows, l, slots, max_n, kv_head, q, dim, head_size, i, h);
    auto score = [&](int t) { return head.score(t); };
    auto value = [&](int t, int d) { return head.value(t, d); };
    const int n = rows[i].n;
    float* out = att + std::int64_t(i) * dim + h * head_size;
    const bool probed = probe != nullptr && i == probe_row;
    if (tile > 0) {
        tiled_head(out, n, tile, head_size, score, value);
        if (!probed || n <= 0) return;
        const SoftmaxStats st = softmax_stats(n, score);
        for (int t = 0; t < n; t++) probe[std::int64_t(h) * max_n + t] = softmax_weight(score(t), st);
        return;
    }
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    if (n <= 0) return;
    const SoftmaxStats st = softmax_stats(n, score);
    for (int t = 0; t < n; t++) {
        const float p = softmax_weight(score(t), st);
        if (probed) probe[std::int64_t(h) * max_n + t] = p;
        for (int d = 0; d < head_size; d++) out[d] = out[d] + p * value(t, d);
    }
}

// Cached attention split as the CPU runs its lanes, for a step of at most kSplitAttentionRows
// rows (decode): a thread per key for the scores, a thread per (row, head) for the softmax, and
// a thread per output channel for the weighted sum of values. Each output is computed by the
// operations attention_head and kernels.h attention_row use, in their order, so the bits are
// theirs. Every score is computed once, not three times, and the work spreads over
// n * n_heads threads, then n_heads * head_size, instead of n_heads.
// scores: [n_rows, n_heads, max_n], room for kSplitAttentionRows rows of max_seq keys, allocated
// once (a captured graph keeps its address).
constexpr int kSplitAttentionRows = 8;

// scores[i][h][t] = (q_i . k_t) / scale, position t of (row i, head h); a t from rows[i].n on
// writes nothing (a captured graph launches max_n's threads and reads the counts at replay).
template <class Row>
KVLAB_HD void attention_score_element(float* scores, const float* q, const Row* rows, int l, const std::int64_t* slots,
                                      int max_n, const int* kv_head, int dim, int n_heads, int head_size, int i, int h,
                                      int t) {
    if (t >= rows[i].n) return;
    const CachedHead<Row> head(rows, l, slots, max_n, kv_head, q, dim, head_size, i, h);
    scores[(std::int64_t(i) * n_heads + h) * max_n + t] = head.score(t);
}

// (row i, head h)'s scores become its softmax weights in place, as kernels.cpp softmax computes
// them: max scanned from t = 0, e_t = exp_f32(s_t - max), their sum in t order, p_t = e_t / sum.
// probe (when not null and i == probe_row): [n_heads, max_n] gets the weights.
template <class Row>
KVLAB_HD void attention_softmax_row(float* scores, const Row* rows, int max_n, int n_heads, int probe_row, float* probe,
                                    int i, int h) {
    const int n = rows[i].n;
    float* x = scores + (std::int64_t(i) * n_heads + h) * max_n;  // [n]
    if (n <= 0) return;
    float max = x[0];
    for (int t = 1; t < n; t++)
        if (x[t] > max) max = x[t];
    for (int t = 0; t < n; t++) x[t] = exp_f32(x[t] - max);
    float sum = 0.0f;
    for (int t = 0; t < n; t++) sum = sum + x[t];
    for (int t = 0; t < n; t++) x[t] = x[t] / sum;
    if (probe != nullptr && i == probe_row)
        for (int t = 0; t < n; t++) probe[std::int64_t(h) * max_n + t] = x[t];
}

// Output channel d of (row i, head h): ((0 + p_0 v_0[d]) + p_1 v_1[d]) + ..., t ascending.
template <class Row>
KVLAB_HD void attention_value_element(float* att, const float* scores, const float* q, const Row* rows, int l,
                                      const std::int64_t* slots, int max_n, const int* kv_head, int dim, int n_heads,
                                      int head_size, int i, int h, int d) {
    const CachedHead<Row> head(rows, l, slots, max_n, kv_head, q, dim, head_size, i, h);
    const float* p = scores + (std::int64_t(i) * n_heads + h) * max_n;  // [rows[i].n]
    float o = 0.0f;
    for (int t = 0; t < rows[i].n; t++) o = o + p[t] * head.value(t, d);
    att[std::int64_t(i) * dim + h * head_size + d] = o;
}

// Flash-decoding for a one-row step (row 0): each (head h, key tile j) is a thread of its own.
// It writes tile j's partial (tiled_head's: the tile's weights, o_j[d] summed over the tile in t
// order) to partial [head_size + 2]: o_j[0..head_size), then m_j, l_j. A tile past the row's
// keys (a captured graph launches max_n's tiles) writes nothing: the fold stops before it.
template <class Row>
KVLAB_HD void attention_tile_partial(float* partials, const float* q, const Row* rows, int l, const std::int64_t* slots,
                                     int max_n, const int* kv_head, int dim, int head_size, int tile, int h, int j) {
    const CachedHead<Row> head(rows, l, slots, max_n, kv_head, q, dim, head_size, 0, h);
    const int n = rows[0].n, t0 = j * tile;
    if (t0 >= n) return;
    const int m = n - t0 < tile ? n - t0 : tile;
    float e[AttentionSpec::kMaxTile];  // the tile's scores, then its weights
    for (int u = 0; u < m; u++) e[u] = head.score(t0 + u);
    const TileStats st = tile_weights(e, m);
    float* partial = partials + (std::int64_t(h) * tile_count(max_n, tile) + j) * (head_size + 2);
    for (int d = 0; d < head_size; d++) {
        float o = 0.0f;
        for (int u = 0; u < m; u++) o = o + e[u] * head.value(t0 + u, d);
        partial[d] = o;
    }
    partial[head_size] = st.m, partial[head_size + 1] = st.l;
}

// Then head h's output: its rows[0].n / tile partials folded in tile order, out = o / l.
template <class Row>
KVLAB_HD void fold_tile_partials(float* att, const float* partials, const Row* rows, int max_n, int head_size, int tile,
                                 int h) {
    const int n = rows[0].n, n_tiles = tile_count(n, tile);
    float* out = att + h * head_size;
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    if (n <= 0) return;
    TileStats acc = tile_fold_start();
    for (int j = 0; j < n_tiles; j++) {
        const float* partial = partials + (std::int64_t(h) * tile_count(max_n, tile) + j) * (head_size + 2);
        const TileFold f = tile_fold(acc, TileStats{partial[head_size], partial[head_size + 1]});
        for (int d = 0; d < head_size; d++) out[d] = tile_fold_o(out[d], partial[d], f);
        acc = f.next;
    }
    for (int d = 0; d < head_size; d++) out[d] = out[d] / acc.l;
}

}  // namespace kvlab::gpu
