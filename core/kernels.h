// kvlab core: the kernels. Every float either decoder produces comes from one of these.
//
// The rule each kernel keeps (NUMERICS.md): an output element is computed by the same
// operations in the same order whatever the number of rows, threads, cache layout or block
// size. Reductions run over k (or t) in increasing order from +0.0f; vectorizing and threading
// happen only across independent output elements.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kv_format.h"
#include "model.h"
#include "numerics.h"

namespace kvlab {

// How a kernel runs (threads) and what it did (floating-point operations, counted by each
// kernel as it runs: one per add, multiply, divide, compare, exp or sqrt).
struct Exec {
    int n_threads = 1;
    std::uint64_t flops = 0;
    // A product with fewer multiply-adds than this runs on the calling thread: starting threads
    // would cost more than it saves. Results are the same either way (tests set it to 0).
    std::int64_t parallel_min_work = std::int64_t{1} << 15;
};

// Y[rows, n_out] = X[rows, n_in] · W[n_in, n_out]; row strides ldy, ldx, ldw (in floats).
// Y[r][o] = (((0 + X[r][0] W[0][o]) + X[r][1] W[1][o]) + ...) in k order, for every r, o.
using MatmulFn = void (*)(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                          int n_in, int n_out);
void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
            int n_out);
// A weight matrix W[n_in, n_out] (in, out) repacked in panels of kPanel columns, so that a
// product streams it front to back: panel p holds W[k][p*kPanel .. p*kPanel+kPanel-1] for
// every k, contiguously, the last panel padded with zeros. Only the memory order changes; each
// output element is summed exactly as matmul sums it. A CPU kernel detail: the CPU backend
// owns its packed copies (cpu_backend.h).
struct PackedMatrix {
    static const int kPanel;  // columns per panel (two vector registers)
    int n_in = 0, n_out = 0;
    const float* w = nullptr;   // [n_in, n_out] the unpacked original (owned by Weights)
    std::vector<float> panels;  // [ceil(n_out / kPanel), n_in, kPanel]
    PackedMatrix() = default;
    PackedMatrix(const float* w, int n_in, int n_out);
};

// Y[rows, n_out] = X[rows, n_in] · W, reading W from its panels; bitwise equal to matmul.
void matmul_packed(Exec& ex, float* y, int ldy, const float* x, int ldx, const PackedMatrix& w, int rows);

// The same product written as the textbook triple loop: the algorithmic reference that the fast
// matmul must match bit for bit (tests/test_kernels.cpp); otherwise identical.
void matmul_reference(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                      int n_out);

// out[rows, dim] = x * w / sqrt(mean(x^2) + 1e-5), per row (llama2.c's order of operations).
void rmsnorm(Exec& ex, float* out, const float* x, const float* w, int rows, int dim);

// Rotates vec[rows, n_heads * head_size] in place; row i is at logical position positions[i].
void rope(Exec& ex, float* vec, int rows, int n_heads, int head_size, std::span<const int> positions,
          const RopeTable& table);

// x[n] = softmax(x[n]); entries of -inf become exact zeros and change nothing else.
void softmax(float* x, int n);
inline std::uint64_t softmax_flops(int n) { return 5ull * std::uint64_t(n); }

// h1[n] = silu(h1[n]) * h3[n], silu(a) = a * (1 / (1 + e^-a)).
void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n);

// x[n] += y[n]
void add(Exec& ex, float* x, const float* y, std::int64_t n);

// dst[n] = a stored row's elements src[n] in `format` (KVFormat's value) decoded to fp32, each
// exactly kv_load(format, src, d, scale, group): bf16 by a shift, fp16 and fp8 by moving their
// fields into fp32's (fp8 then times the scale), int8 and int4 group by group as code * scale +
// min. The CPU's attention decodes a row with it before the row's dot products; the GPU kernel
// calls kv_load per element.
void decode_kv_row(int format, const void* src, int n, float scale, float* dst, int group = 0);

// s[j] = q · rows[j] (head_size floats each) for the 8 rows, each the scalar loop's sum:
// s = 0; s = s + q[d] * rows[j][d] for d = 0, 1, ... Eight keys are eight lanes (AVX2: the rows
// are transposed in registers), so each lane's order is the scalar loop's and so are its bits.
void dot_rows8(const float* q, const float* const* rows, int head_size, float* s);

// Attention for one query row of one head, over logical positions t = 0..n-1 in order:
//   score[t] = (q · k_t) / sqrt(head_size);  p = softmax(score);  out = sum_t p[t] v_t
// key(t) and value(t) return pointers to the head_size floats of position t wherever the cache
// keeps them, so every cache layout runs exactly this code. Keys are scored eight at a time
// (dot_rows8), and values summed eight at a time: a pointer key(t) or value(t) returns must stay
// valid while it is called for the next seven positions. scores has room for n floats.
inline float attention_scale(int head_size) { return std::sqrt(float(head_size)); }
template <class KeyRow, class ValueRow>
void attention_row(float* out, const float* q, int head_size, int n, KeyRow key, ValueRow value, float* scores) {
    const float scale = attention_scale(head_size);
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        const float* rows[8];
        for (int j = 0; j < 8; j++) rows[j] = key(t + j);
        dot_rows8(q, rows, head_size, scores + t);
        for (int j = 0; j < 8; j++) scores[t + j] = scores[t + j] / scale;
    }
    for (; t < n; t++) {
        const float* k = key(t);
        float s = 0.0f;
        for (int d = 0; d < head_size; d++) s = s + q[d] * k[d];
        scores[t] = s / scale;
    }
    softmax(scores, n);
    // out[d] = out[d] + p[t] * v_t[d], t ascending for every d; eight values at a time, so out[d]
    // goes through memory once per eight terms (the order of its terms is unchanged).
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    t = 0;
    for (; t + 8 <= n; t += 8) {
        const float* v[8];
        for (int j = 0; j < 8; j++) v[j] = value(t + j);
        const float* p = scores + t;
        for (int d = 0; d < head_size; d++) {
            float o = out[d];
            for (int j = 0; j < 8; j++) o = o + p[j] * v[j][d];
            out[d] = o;
        }
    }
    for (; t < n; t++) {
        const float p = scores[t];
        const float* v = value(t);
        for (int d = 0; d < head_size; d++) out[d] = out[d] + p * v[d];
    }
}
inline std::uint64_t attention_row_flops(int head_size, int n) {
    return std::uint64_t(n) * (2ull * head_size + 1) + softmax_flops(n) + 2ull * std::uint64_t(n) * head_size;
}

}  // namespace kvlab
