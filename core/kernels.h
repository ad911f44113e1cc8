// kvlab core: the kernels. Every float either decoder produces comes from one of these.
//
// The rule each kernel keeps (NUMERICS.md): an output element is computed by the same
// operations in the same order whatever the number of rows, threads, cache layout or block
// size. Reductions run over k (or t) in increasing order from +0.0f; vectorizing and threading
// happen only across independent output elements.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kv_format.h"
#include "model.h"
#include "numerics.h"
#include "tiled_attention.h"

namespace kvlab {

// How a kernel runs (threads) and what it did (floating-point operations, counted by each
// kernel as it runs: one per add, multiply, divide, compare, exp or sqrt).
struct Exec {
    int n_threads = 1;
    std::uint64_t flops = 0;
    // A product with fewer multiply-adds than this runs on the calling thread: starting threads
    // would cost more than it saves. Results are the same either way (tests set it to 0).
    std::int64_t parallel_min_work = std::int64_t{1} << 15;
    // Which attention runs (tiled_attention.h). Unlike the thread count this changes bits: two
    // decoders compared bit for bit must run the same one.
    AttentionSpec attention;
};

// Y[rows, n_out] = X[rows, n_in] · W[n_in, n_out]; row strides ldy, ldx, ldw (in floats).
// Y[r][o] = (((0 + X[r][0] W[0][o]) + X[r][1] W[1][o]) + ...) in k order, for every r, o.
using MatmulFn = void (*)(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                          int n_in, int n_out);
void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
            int n_out);
// A weight matrix repacked in panels of kPanel columns of W[n_in, n_out], so that a product
// streams it front to back: panel p holds W[k][p*kPanel .. p*kPanel+kPanel-1] for every k,
// contiguously, the last panel padded with zeros. Only the memory order changes; each output
// element is summed exactly as matmul sums it. A CPU kernel detail: the panels live in the CPU
// backend's PackedWeights (cpu_backend.h), in memory or mapped from the panel cache.
struct PackedMatrix {
    static const int kPanel;  // columns per panel (two vector registers)
    int n_in = 0, n_out = 0;
    const float* panels = nullptr;  // [ceil(n_out / kPanel), n_in, kPanel]
    // Floats in the panels of an n_in x n_out matrix.
    static std::int64_t floats(int n_in, int n_out);
    // dst[ceil(n_out / kPanel), n_in, kPanel] = the panels of the matrix held [n_out][n_in] (out, in)
    // in w: the layout of a checkpoint's matrices (Weights).
    static void pack(const float* w, int n_in, int n_out, float* dst);
};

// Y[rows, n_out] = X[rows, n_in] · W, reading W from its panels; bitwise equal to matmul.
void matmul_packed(Exec& ex, float* y, int ldy, const float* x, int ldx, const PackedMatrix& w, int rows);

// One of several products of the same input: y[rows, w->n_out] (row stride ldy) = x · *w.
struct PackedProduct {
    float* y = nullptr;
    int ldy = 0;
    const PackedMatrix* w = nullptr;
};
// Every product of `group` (all of n_in = the x's width), each element exactly as matmul_packed
// computes it, in one parallel loop over all their tiles: the threads meet once rather than once
// a product, and the tiles of small products share them evenly.
void matmul_packed_group(Exec& ex, const float* x, int ldx, int rows, std::span<const PackedProduct> group);

// The same product written as the textbook triple loop: the algorithmic reference that the fast
// matmul must match bit for bit (tests/test_kernels.cpp); otherwise identical.
void matmul_reference(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                      int n_out);

// out[rows, dim] = x * w / sqrt(mean(x^2) + 1e-5), per row (llama2.c's order of operations).
void rmsnorm(Exec& ex, float* out, const float* x, const float* w, int rows, int dim);

// Rotates vec[rows, n_heads * head_size] in place; row i is at logical position positions[i].
void rope(Exec& ex, float* vec, int rows, int n_heads, int head_size, std::span<const int> positions,
          const RopeTable& table);

// out[n] = exp_f32(x[n]), a vector register of lanes at a time: each lane runs exp_f32's
// operations in its order (its branches become selects), so every bit is exp_f32's.
void exp_f32_n(const float* x, float* out, std::int64_t n);

// x[n] = softmax(x[n]); entries of -inf become exact zeros and change nothing else.
void softmax(float* x, int n);
inline std::uint64_t softmax_flops(int n) { return 5ull * std::uint64_t(n); }

// log p(token) under softmax(x[n]), computed as a log-softmax: (x[token] - max) - ln sum,
// max scanned from x[0] and sum = sum_j e^(x_j - max) in index order (softmax's), never as the
// log of a rounded probability (which loses every digit of a small one). Rescoring and decode
// both call it on bitwise-equal logits, so their log-probabilities agree bit for bit.
inline float token_logprob(const float* x, int n, int token) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum = sum + exp_f32(x[i] - max);
    return (x[token] - max) - log_f32(sum);
}

// h1[n] = silu(h1[n]) * h3[n], silu(a) = a * (1 / (1 + e^-a)).
void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n);

// x[n] += y[n]
void add(Exec& ex, float* x, const float* y, std::int64_t n);

// dst[n] = a stored row's elements src[n] in `format` (KVFormat's value) decoded to fp32, each
// exactly kv_load(format, src, d, scale, group): bf16 by a shift, fp16 and fp8 by the hardware's
// exact fp16 conversion where the build has AVX-512 (else by moving their fields into fp32's;
// fp8 then times the scale), int8 and int4 as code * scale + min with their group's scale and
// minimum. The CPU's attention decodes rows with it before their dot products; the GPU kernel
// calls kv_load per element.
void decode_kv_row(int format, const void* src, int n, float scale, float* dst, int group = 0);

// dst[n_rows, n] = n_rows stored rows of n elements, row_bytes apart from src, each decoded as
// decode_kv_row decodes it (a float format's adjacent rows as one run).
void decode_kv_rows(int format, const void* src, std::int64_t row_bytes, int n_rows, int n, float scale, float* dst,
                    int group = 0);

// s[j] = q · rows[j] (head_size floats each) for the 8 rows, each the scalar loop's sum:
// s = 0; s = s + q[d] * rows[j][d] for d = 0, 1, ... Eight keys are eight lanes (AVX2: the rows
// are transposed in registers), so each lane's order is the scalar loop's and so are its bits.
void dot_rows8(const float* q, const float* const* rows, int head_size, float* s);
// The same for 16 rows (s[16]): sixteen lanes where the build has AVX-512, else two dot_rows8.
void dot_rows16(const float* q, const float* const* rows, int head_size, float* s);

// rows[j] = row(t0 + j) for j = 0..7: through the accessor's rows8 where it has one (a cache
// hands over eight adjacent rows at once, decoded together), else one call per row.
template <class RowOf>
void eight_rows(RowOf& row, int t0, const float** rows) {
    if constexpr (requires { row.rows8(t0, rows); })
        row.rows8(t0, rows);
    else
        for (int j = 0; j < 8; j++) rows[j] = row(t0 + j);
}

// sqrt(head_size), correctly rounded: every score is divided by it.
inline float attention_scale(int head_size) { return std::sqrt(float(head_size)); }

// s[t - t0] = (q · key(t)) / scale for t = t0..t1-1, q and each key head_size floats: sixteen or
// eight keys at a time through dot_rows16 and dot_rows8 (each lane the scalar loop's sum), the
// rest one by one. MLA (mla.h) divides by the scale of the head it stands for, not of the row.
template <class KeyRow>
void score_rows_scaled(float* s, const float* q, int head_size, float scale, int t0, int t1, KeyRow key) {
    int t = t0;
    // (a head narrower than 16 would fill the 16 lanes element by element: two of 8 are faster)
    for (; t + 16 <= t1 && head_size >= 16; t += 16) {
        const float* rows[16];
        eight_rows(key, t, rows);
        eight_rows(key, t + 8, rows + 8);
        dot_rows16(q, rows, head_size, s + (t - t0));
        for (int j = 0; j < 16; j++) s[t - t0 + j] = s[t - t0 + j] / scale;
    }
    for (; t + 8 <= t1; t += 8) {
        const float* rows[8];
        eight_rows(key, t, rows);
        dot_rows8(q, rows, head_size, s + (t - t0));
        for (int j = 0; j < 8; j++) s[t - t0 + j] = s[t - t0 + j] / scale;
    }
    for (; t < t1; t++) {
        const float* k = key(t);
        float x = 0.0f;
        for (int d = 0; d < head_size; d++) x = x + q[d] * k[d];
        s[t - t0] = x / scale;
    }
}

// s[t - t0] = (q · key(t)) / sqrt(head_size) for t = t0..t1-1.
template <class KeyRow>
void score_rows(float* s, const float* q, int head_size, int t0, int t1, KeyRow key) {
    score_rows_scaled(s, q, head_size, attention_scale(head_size), t0, t1, key);
}

// out[d] = ((0 + p[0] v_t0[d]) + p[1] v_t0+1[d]) + ... over t = t0..t1-1 in order, for every
// d; eight values at a time, so out[d] goes through memory once per eight terms (the order of
// its terms is unchanged).
template <class ValueRow>
void sum_values(float* out, const float* p, int head_size, int t0, int t1, ValueRow value) {
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    int t = t0;
    for (; t + 8 <= t1; t += 8) {
        const float* v[8];
        eight_rows(value, t, v);
        const float* pt = p + (t - t0);
        for (int d = 0; d < head_size; d++) {
            float o = out[d];
            for (int j = 0; j < 8; j++) o = o + pt[j] * v[j][d];
            out[d] = o;
        }
    }
    for (; t < t1; t++) {
        const float pt = p[t - t0];
        const float* v = value(t);
        for (int d = 0; d < head_size; d++) out[d] = out[d] + pt * v[d];
    }
}

// Attention for one query row of one head, over logical positions t = 0..n-1 in order:
//   score[t] = (q · k_t) / sqrt(head_size);  p = softmax(score);  out = sum_t p[t] v_t
// key(t) and value(t) return pointers to the head_size floats of position t wherever the cache
// keeps them, so every cache layout runs exactly this code. A pointer key(t) or value(t) returns
// must stay valid while it is called for the next fifteen positions (they are read sixteen at a
// time); an accessor may also have rows8(t0, rows), eight_rows' batch of the same pointers,
// valid until it is called for t0 + 16. scores has room for n floats.
template <class KeyRow, class ValueRow>
void attention_row(float* out, const float* q, int head_size, int n, KeyRow key, ValueRow value, float* scores) {
    score_rows(scores, q, head_size, 0, n, key);
    softmax(scores, n);
    sum_values(out, scores, head_size, 0, n, value);
}

// Tiled attention's partial of key tile t0..t1-1 for one query row (tiled_attention.h):
// e[t1 - t0] the tile's weights e_t, o[head_size] = sum e_t v_t; returns (m_j, l_j).
template <class KeyRow, class ValueRow>
TileStats attention_tile(float* o, float* e, const float* q, int head_size, int t0, int t1, KeyRow key,
                         ValueRow value) {
    score_rows(e, q, head_size, t0, t1, key);
    const TileStats stats = tile_weights(e, t1 - t0);
    sum_values(o, e, head_size, t0, t1, value);
    return stats;
}

// Folds a tile's partial (o[head_size], stats) into the running (out[head_size], acc).
inline void fold_tile(float* out, TileStats& acc, const float* o, TileStats stats, int head_size) {
    const TileFold f = tile_fold(acc, stats);
    for (int d = 0; d < head_size; d++) out[d] = tile_fold_o(out[d], o[d], f);
    acc = f.next;
}

// The same row as tiled attention: the tiles of `tile` keys computed and folded in order, then
// out = o / l. scratch: [tile + head_size]. n = 0 leaves out zero.
template <class KeyRow, class ValueRow>
void tiled_attention_row(float* out, const float* q, int head_size, int n, int tile, KeyRow key, ValueRow value,
                         float* scratch) {
    float* e = scratch;         // [tile]
    float* o = scratch + tile;  // [head_size]
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    if (n <= 0) return;
    TileStats acc = tile_fold_start();
    for (int t0 = 0; t0 < n; t0 += tile) {
        const TileStats stats = attention_tile(o, e, q, head_size, t0, std::min(t0 + tile, n), key, value);
        fold_tile(out, acc, o, stats, head_size);
    }
    for (int d = 0; d < head_size; d++) out[d] = out[d] / acc.l;
}

inline std::uint64_t attention_row_flops(int head_size, int n) {
    return std::uint64_t(n) * (2ull * head_size + 1) + softmax_flops(n) + 2ull * std::uint64_t(n) * head_size;
}
// Naive decode's attention over T rows, every head, as the CPU counts it: Q K^T, the divisions,
// the softmax and P V of the masked T x T matrices (simple), or each row's tiles (tiled).
inline std::uint64_t causal_attention_flops(int n_heads, int head_size, int T, const AttentionSpec& a) {
    const std::uint64_t t = std::uint64_t(T), hs = std::uint64_t(head_size);
    std::uint64_t per_head = 0;
    if (!a.tiled())
        return std::uint64_t(n_heads) * (2 * t * hs * t + t * (t + 1) / 2 + t * softmax_flops(T) + 2 * t * t * hs);
    for (int i = 0; i < T; i++) per_head += tiled_attention_flops(head_size, i + 1, a.tile);
    return std::uint64_t(n_heads) * per_head;
}

}  // namespace kvlab
