// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*() and then warn that
// they are uninitialized; the warnings say nothing about this file's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <xsimd/xsimd.hpp>

#include "config.h"
#include "thread_pool.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kvlab {

namespace {

using Batch = xsimd::batch<float>;
constexpr int kB = int(Batch::size);  // floats per vector register (8 with AVX2, 16 with AVX-512)
constexpr int kMR = 4;                // rows per tile
constexpr int kNB = 2;                // vector registers per tile row
constexpr int kNR = kNB * kB;         // columns per tile

// One R x (NB * kB) tile of Y: R * NB accumulators stay in registers while k runs 0..n_in-1.
// Each lane is one output element, and it sees acc + x*w in k order: exactly the scalar loop.
template <int R, int NB>
void tile(float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int n_in) {
    Batch acc[R][NB];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) acc[r][b] = Batch(0.0f);
    for (int k = 0; k < n_in; k++) {
        Batch wk[NB];
        for (int b = 0; b < NB; b++) wk[b] = Batch::load_unaligned(w + std::int64_t(k) * ldw + b * kB);
        for (int r = 0; r < R; r++) {
            const Batch xr(x[std::int64_t(r) * ldx + k]);
            for (int b = 0; b < NB; b++) acc[r][b] = acc[r][b] + xr * wk[b];
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < NB; b++) acc[r][b].store_unaligned(y + std::int64_t(r) * ldy + b * kB);
}

template <int NB>
void tile_rows(int rows, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int n_in) {
    switch (rows) {
        case 4: tile<4, NB>(y, ldy, x, ldx, w, ldw, n_in); break;
        case 3: tile<3, NB>(y, ldy, x, ldx, w, ldw, n_in); break;
        case 2: tile<2, NB>(y, ldy, x, ldx, w, ldw, n_in); break;
        case 1: tile<1, NB>(y, ldy, x, ldx, w, ldw, n_in); break;
        default: assert(false);
    }
}

// Columns left over after the vector tiles: the same k-order sum, one element at a time.
void scalar_cols(int rows, int n_cols, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int n_in) {
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_cols; o++) {
            float s = 0.0f;
            for (int k = 0; k < n_in; k++) s = s + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
            y[std::int64_t(r) * ldy + o] = s;
        }
}

// Counts the product's FLOPs, then calls tile(r0, mr, c0, nc) for every kMR x kNR tile of
// Y[rows, n_out] (the last ones may be smaller), on threads when the product is big enough.
// Column tiles outside, row tiles inside: neighbouring tiles reuse the same strip of W.
template <class Tile>
void for_each_tile(Exec& ex, int rows, int n_in, int n_out, Tile tile) {
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    if (rows == 0 || n_out == 0) return;
    const int n_row_tiles = (rows + kMR - 1) / kMR;
    const std::int64_t n_tiles = std::int64_t(n_row_tiles) * ((n_out + kNR - 1) / kNR);
    const bool parallel = ex.n_threads > 1 && std::int64_t(rows) * n_in * n_out >= ex.parallel_min_work;
    parallel_for(parallel ? ex.n_threads : 1, n_tiles, [&](std::int64_t i, int) {
        const int r0 = int(i % n_row_tiles) * kMR, c0 = int(i / n_row_tiles) * kNR;
        tile(r0, std::min(kMR, rows - r0), c0, std::min(kNR, n_out - c0));
    });
}

}  // namespace

void matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
            int n_out) {
    assert(rows >= 0 && n_in >= 0 && n_out >= 0 && ldy >= n_out && ldx >= n_in && ldw >= n_out);
    // An empty sum is +0; x and w may then be null (empty buffers), and x + r0 * ldx or w + c0
    // would be undefined, so y is filled without forming either.
    if (n_in == 0) {
        for (int r = 0; r < rows && n_out > 0; r++) std::fill_n(y + std::int64_t(r) * ldy, n_out, 0.0f);
        return;
    }
    for_each_tile(ex, rows, n_in, n_out, [&](int r0, int mr, int c0, int nc) {
        float* yt = y + std::int64_t(r0) * ldy + c0;
        const float* xt = x + std::int64_t(r0) * ldx;
        const float* wt = w + c0;
        // A full tile in registers; a narrower last one a register at a time, then scalars.
        int done = 0;
        if (nc == kNR) {
            tile_rows<kNB>(mr, yt, ldy, xt, ldx, wt, ldw, n_in);
            done = kNR;
        } else {
            for (; done + kB <= nc; done += kB) tile_rows<1>(mr, yt + done, ldy, xt, ldx, wt + done, ldw, n_in);
        }
        if (done < nc) scalar_cols(mr, nc - done, yt + done, ldy, xt, ldx, wt + done, ldw, n_in);
    });
}

const int PackedMatrix::kPanel = kNR;

std::int64_t PackedMatrix::floats(int n_in, int n_out) { return std::int64_t((n_out + kNR - 1) / kNR) * n_in * kNR; }

void PackedMatrix::pack(const float* w, int n_in, int n_out, float* dst) {
    const int n_panels = (n_out + kNR - 1) / kNR;
    for (int p = 0; p < n_panels; p++) {
        float* panel = dst + std::int64_t(p) * n_in * kNR;  // [n_in, kNR]
        for (int c = 0; c < kNR; c++) {
            const int o = p * kNR + c;
            if (o >= n_out) {  // the last panel's padding
                for (int k = 0; k < n_in; k++) panel[std::int64_t(k) * kNR + c] = 0.0f;
                continue;
            }
            const float* row = w + std::int64_t(o) * n_in;  // W[o][0 .. n_in - 1]
            for (int k = 0; k < n_in; k++) panel[std::int64_t(k) * kNR + c] = row[k];
        }
    }
}

namespace {

// Tile (r0, mr, c0, nc) of Y = X · W from W's panels.
void packed_tile(float* y, int ldy, const float* x, int ldx, const PackedMatrix& w, int r0, int mr, int c0, int nc) {
    const int n_in = w.n_in;
    const float* panel = w.panels + std::size_t(c0 / kNR) * n_in * kNR;
    const float* xt = x + std::int64_t(r0) * ldx;
    if (nc == kNR) {
        tile_rows<kNB>(mr, y + std::int64_t(r0) * ldy + c0, ldy, xt, ldx, panel, kNR, n_in);
    } else {
        // The padded last panel: compute all kNR lanes, keep the real columns.
        float tmp[kMR * kNR];
        tile_rows<kNB>(mr, tmp, kNR, xt, ldx, panel, kNR, n_in);
        for (int r = 0; r < mr; r++) std::copy_n(tmp + r * kNR, nc, y + std::int64_t(r0 + r) * ldy + c0);
    }
}

}  // namespace

void matmul_packed(Exec& ex, float* y, int ldy, const float* x, int ldx, const PackedMatrix& w, int rows) {
    const PackedProduct one{y, ldy, &w};
    matmul_packed_group(ex, x, ldx, rows, std::span<const PackedProduct>(&one, 1));
}

void matmul_packed_group(Exec& ex, const float* x, int ldx, int rows, std::span<const PackedProduct> group) {
    assert(rows >= 0 && !group.empty() && group.size() <= 4);
    const int n_in = group[0].w->n_in, n_row_tiles = (rows + kMR - 1) / kMR;
    std::int64_t first_tile[5] = {0};  // product p's tiles are first_tile[p] .. first_tile[p + 1] - 1
    std::int64_t work = 0;
    for (std::size_t p = 0; p < group.size(); p++) {
        const PackedMatrix& w = *group[p].w;
        assert(w.n_in == n_in && group[p].ldy >= w.n_out && ldx >= n_in);
        assert(w.panels != nullptr || w.n_out == 0 || n_in == 0);
        ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(w.n_out);
        work += std::int64_t(rows) * n_in * w.n_out;
        first_tile[p + 1] = first_tile[p] + std::int64_t(n_row_tiles) * ((w.n_out + kNR - 1) / kNR);
    }
    const std::int64_t n_tiles = first_tile[group.size()];
    if (n_tiles == 0) return;
    const bool parallel = ex.n_threads > 1 && work >= ex.parallel_min_work;
    // Column tiles outside, row tiles inside, as for_each_tile orders them.
    parallel_for(parallel ? ex.n_threads : 1, n_tiles, [&](std::int64_t i, int) {
        std::size_t p = 0;
        while (i >= first_tile[p + 1]) p++;
        const PackedProduct& g = group[p];
        const std::int64_t t = i - first_tile[p];
        const int r0 = int(t % n_row_tiles) * kMR, c0 = int(t / n_row_tiles) * kNR;
        packed_tile(g.y, g.ldy, x, ldx, *g.w, r0, std::min(kMR, rows - r0), c0, std::min(kNR, g.w->n_out - c0));
    });
}

void matmul_reference(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                      int n_out) {
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    scalar_cols(rows, n_out, y, ldy, x, ldx, w, ldw, n_in);
}

void rmsnorm(Exec& ex, float* out, const float* x, const float* w, int rows, int dim) {
    ex.flops += std::uint64_t(rows) * (5ull * dim + 4);
    for (int r = 0; r < rows; r++) {
        const float* xr = x + std::int64_t(r) * dim;
        float* o = out + std::int64_t(r) * dim;
        float ss = 0.0f;
        for (int j = 0; j < dim; j++) ss = ss + xr[j] * xr[j];
        ss = ss / float(dim);
        ss = ss + 1e-5f;
        ss = 1.0f / std::sqrt(ss);
        for (int j = 0; j < dim; j++) o[j] = w[j] * (ss * xr[j]);
    }
}

void rope(Exec& ex, float* vec, int rows, int n_heads, int head_size, std::span<const int> positions,
          const RopeTable& table) {
    assert(int(positions.size()) == rows);
    const int n_pairs = head_size / 2;
    assert(table.n_pairs == n_pairs);
    ex.flops += 6ull * std::uint64_t(rows) * n_heads * n_pairs;
    for (int r = 0; r < rows; r++) {
        const int pos = positions[r];
        assert(pos >= 0 && pos < table.max_seq);
        const float* c = table.cos.data() + std::int64_t(pos) * n_pairs;
        const float* s = table.sin.data() + std::int64_t(pos) * n_pairs;
        for (int h = 0; h < n_heads; h++) {
            float* v = vec + (std::int64_t(r) * n_heads + h) * head_size;
            for (int j = 0; j < n_pairs; j++) {
                const float v0 = v[2 * j], v1 = v[2 * j + 1];
                v[2 * j] = v0 * c[j] - v1 * s[j];
                v[2 * j + 1] = v0 * s[j] + v1 * c[j];
            }
        }
    }
}

#if defined(__AVX2__)
namespace {
// r[i] becomes column i of the 8 x 8 block whose rows were r[0..7].
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
}  // namespace
#endif

#if defined(__AVX512F__)
namespace {
// r[i] becomes column i of the 16 x 16 block whose rows were r[0..15].
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {  // within 128-bit lanes: pairs of rows interleaved
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // lane k of u[i + m]: rows i..i+3 of column 4k + m
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int m = 0; m < 4; m++) {  // then the four row groups' lanes k gathered into column 4k + m
        const __m512 even_lo = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88),
                     odd_lo = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
        const __m512 even_hi = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88),
                     odd_hi = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
        r[m] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
        r[8 + m] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd);
        r[4 + m] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd);
    }
}
}  // namespace
#endif

void dot_rows16(const float* q, const float* const* rows, int head_size, float* s) {
#if defined(__AVX512F__)
    // Lane j is row j: acc_j = acc_j + q[d] * rows[j][d], d ascending; a multiply, then an add.
    __m512 acc = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= head_size; d += 16) {
        __m512 r[16];
        for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(rows[j] + d);
        transpose16(r);  // r[i]: element d + i of the 16 rows
        for (int i = 0; i < 16; i++) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(q[d + i]), r[i]));
    }
    for (; d < head_size; d++) {
        alignas(64) float col[16];
        for (int j = 0; j < 16; j++) col[j] = rows[j][d];
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(q[d]), _mm512_load_ps(col)));
    }
    _mm512_storeu_ps(s, acc);
#else
    dot_rows8(q, rows, head_size, s);
    dot_rows8(q, rows + 8, head_size, s + 8);
#endif
}

void dot_rows8(const float* q, const float* const* rows, int head_size, float* s) {
    int d = 0;
#if defined(__AVX2__)
    // Lane j is row j: acc_j = acc_j + q[d] * rows[j][d], d ascending; a multiply, then an add.
    __m256 acc = _mm256_setzero_ps();
    for (; d + 8 <= head_size; d += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(rows[j] + d);
        transpose8(r);  // r[i]: element d + i of the 8 rows
        for (int i = 0; i < 8; i++) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + i]), r[i]));
    }
    for (; d < head_size; d++) {
        const __m256 col = _mm256_setr_ps(rows[0][d], rows[1][d], rows[2][d], rows[3][d], rows[4][d], rows[5][d],
                                          rows[6][d], rows[7][d]);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d]), col));
    }
    _mm256_storeu_ps(s, acc);
#else
    for (int j = 0; j < 8; j++) {
        float x = 0.0f;
        for (d = 0; d < head_size; d++) x = x + q[d] * rows[j][d];
        s[j] = x;
    }
#endif
}

namespace {

// exp_f32 on kB lanes: the same multiplies, adds and floor per lane; its early returns and its
// three scalings by 2^k are computed for every lane and selected, in exp_f32's order of cases.
Batch exp_batch(Batch x) {
    using namespace exp_f32_constants;
    using IBatch = xsimd::batch<std::int32_t>;
    const Batch n = xsimd::floor(x * Batch(kLog2e) + Batch(0.5f));
    const Batch r = (x - n * Batch(kLn2Hi)) - n * Batch(kLn2Lo);
    Batch p(1.0f / 5040.0f);
    p = p * r + Batch(1.0f / 720.0f);
    p = p * r + Batch(1.0f / 120.0f);
    p = p * r + Batch(1.0f / 24.0f);
    p = p * r + Batch(1.0f / 6.0f);
    p = p * r + Batch(0.5f);
    p = p * r + Batch(1.0f);
    p = p * r + Batch(1.0f);
    const IBatch k = xsimd::batch_cast<std::int32_t>(n);  // n is a whole number: exact where used
    auto pow2 = [](IBatch e) { return xsimd::bitwise_cast<Batch>((e + IBatch(127)) << 23); };
    const Batch normal = p * pow2(k);
    const Batch big = p * Batch(pow2_f32(127)) * Batch(2.0f);
    const Batch small = p * pow2(k + IBatch(100)) * Batch(pow2_f32(-100));
    Batch out = xsimd::select(n > Batch(127.0f), big, xsimd::select(n < Batch(-126.0f), small, normal));
    out = xsimd::select(x < Batch(kUnderflow), Batch(0.0f), out);
    out = xsimd::select(x > Batch(kOverflow), Batch(float_from_bits(0x7f800000u)), out);
    return xsimd::select(xsimd::isnan(x), x, out);  // (xsimd's != is ordered: false for NaN)
}

}  // namespace

void exp_f32_n(const float* x, float* out, std::int64_t n) {
    std::int64_t i = 0;
    for (; i + kB <= n; i += kB) exp_batch(Batch::load_unaligned(x + i)).store_unaligned(out + i);
    for (; i < n; i++) out[i] = exp_f32(x[i]);
}

void softmax(float* x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    // The exponentials first (independent: a vector register at a time), then their sum in index order.
    int i0 = 0;
    for (; i0 + kB <= n; i0 += kB) exp_batch(Batch::load_unaligned(x + i0) - Batch(max)).store_unaligned(x + i0);
    for (int i = i0; i < n; i++) x[i] = exp_f32(x[i] - max);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum = sum + x[i];
    for (int i = 0; i < n; i++) x[i] = x[i] / sum;
}

void silu_mul(Exec& ex, float* h1, const float* h3, std::int64_t n) {
    ex.flops += 5ull * std::uint64_t(n);
    std::int64_t i0 = 0;
    for (; i0 + kB <= n; i0 += kB) {  // the scalar loop's operations, a register of lanes at a time
        const Batch a = Batch::load_unaligned(h1 + i0);
        const Batch s = a * (Batch(1.0f) / (Batch(1.0f) + exp_batch(-a)));
        (s * Batch::load_unaligned(h3 + i0)).store_unaligned(h1 + i0);
    }
    for (std::int64_t i = i0; i < n; i++) {
        float a = h1[i];
        a = a * (1.0f / (1.0f + exp_f32(-a)));
        h1[i] = a * h3[i];
    }
}

void add(Exec& ex, float* x, const float* y, std::int64_t n) {
    ex.flops += std::uint64_t(n);
    for (std::int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

namespace {

// A code's magnitude bits `m` (exponent and mantissa, sign cleared) placed at fp32's, shifted
// left by `shift` (23 - man_bits), are fp32 bits whose value is the code's times 2^-(127 - bias):
// normals and subnormals alike (an fp32 subnormal for a subnormal code). Times 2^(127 - bias),
// a power of two with an exact product, that is the code's value. Magnitudes from `special` up
// are infinity (== special) or NaN; has_inf false: only `special` itself, NaN. Then the sign.
template <class Code>
void decode_row(const Code* c, int n, float* dst, std::uint32_t mag_mask, int shift, float rebias,
                std::uint32_t special, bool has_inf) {
    const std::uint32_t sign_shift = 31 - (8 * sizeof(Code) - 1);
    for (int d = 0; d < n; d++) {
        const std::uint32_t u = c[d], m = u & mag_mask, sign = (u & ~mag_mask) << sign_shift;
        std::uint32_t bits = float_bits(float_from_bits(m << shift) * rebias);
        if (m >= special) bits = has_inf && m == special ? 0x7f800000u : 0x7fc00000u;
        dst[d] = float_from_bits(bits | sign);
    }
}

#if defined(__AVX2__)
// Eight fp8 codes at a time, with no fp32 subnormal as an operand (x86 slows down for those by
// two orders of magnitude): a normal code's fields move into fp32's and its exponent is rebiased
// by an integer add; a subnormal's mantissa is converted and scaled by the smallest subnormal
// (an integer below 2^man_bits times a normal power of two: exact); the special codes are
// decode_float's infinity or quiet NaN; then the sign. decode_float's values, bit for bit (a test
// compares every code). Returns how many elements it decoded: the rest are the caller's.
template <int kManBits, int kBias, bool kHasInf>
int decode_fp8_avx2(const std::uint8_t* c, int n, float* dst) {
    const __m256i mag_mask = _mm256_set1_epi32(0x7f), man_limit = _mm256_set1_epi32((1 << kManBits) - 1);
    const __m256i rebias = _mm256_set1_epi32((127 - kBias) << 23);
    const __m256 step = _mm256_set1_ps(std::bit_cast<float>(std::uint32_t(127 + 1 - kBias - kManBits) << 23));
    const int special = kHasInf ? (0x7f >> kManBits) << kManBits : 0x7f;  // infinity's magnitude, or NaN's
    const __m256i special_m1 = _mm256_set1_epi32(special - 1), special_v = _mm256_set1_epi32(special);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), nan = _mm256_set1_epi32(0x7fc00000);
    int d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + d)));
        const __m256i m = _mm256_and_si256(u, mag_mask);
        const __m256i sign = _mm256_slli_epi32(_mm256_andnot_si256(mag_mask, u), 24);
        const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(m, 23 - kManBits), rebias);
        const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(m), step));
        __m256i bits =
            _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_add_epi32(man_limit, _mm256_set1_epi32(1)), m));
        const __m256i special_bits = kHasInf ? _mm256_blendv_epi8(nan, inf, _mm256_cmpeq_epi32(m, special_v)) : nan;
        bits = _mm256_blendv_epi8(bits, special_bits, _mm256_cmpgt_epi32(m, special_m1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), _mm256_or_si256(bits, sign));
    }
    return d;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// Sixteen fp16, fp8-e5m2 or fp8-e4m3 codes at a time through the hardware's exact fp16 to fp32
// conversion: an fp16 code as it is; an e5m2 code is fp16's top byte; an e4m3 code shifted up 7
// bits has its exponent and mantissa at fp16's and its sign at bit 14, which adding that bit
// to itself carries into bit 15 (bit 15 was clear). Read as fp16, an e4m3 code is its value
// times 2^-8 (the biases differ by 8); times 2^8 * scale, exact (a power of two times the
// scale), that is kv_load's one rounding of value * scale. NaN codes become decode_float's
// quiet NaN with the code's sign. Returns how many elements it decoded: the rest are the
// caller's. (No fp32 subnormal is an operand of an arithmetic instruction here: x86 slows down
// by two orders of magnitude for those.)
template <KVFormat kFormat>
int decode_half_avx512(const void* src, int n, float scale, float* dst) {
    const __m256i bit14 = _mm256_set1_epi16(0x4000), mag16 = _mm256_set1_epi16(0x7fff);
    // the largest magnitude that is a number, as fp16 bits: infinity, or e4m3's 0x7e shifted
    const __m256i last_number = _mm256_set1_epi16(kFormat == KVFormat::fp8_e4m3 ? 0x7e << 7 : 0x7c00);
    const __m512i sign32 = _mm512_set1_epi32(std::int32_t(0x80000000u)), qnan = _mm512_set1_epi32(0x7fc00000);
    const float times = kFormat == KVFormat::fp8_e4m3 ? 256.0f * scale : scale;
    const bool multiply = times != 1.0f;
    if (!std::isfinite(times)) return 0;  // 2^8 * scale overflows: the caller's scalar loop decodes it all
    const __m512 vtimes = _mm512_set1_ps(times);
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        __m256i h;
        if constexpr (kFormat == KVFormat::fp16) {
            h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(src) + d));
        } else {
            const auto* c = static_cast<const std::uint8_t*>(src) + d;
            const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
            if constexpr (kFormat == KVFormat::fp8_e5m2) {
                h = _mm256_slli_epi16(w, 8);
            } else {
                const __m256i x = _mm256_slli_epi16(w, 7);
                h = _mm256_add_epi16(x, _mm256_and_si256(x, bit14));
            }
        }
        const __mmask16 nan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, mag16), last_number);
        __m512 f = _mm512_cvtph_ps(h);
        if (multiply) f = _mm512_mul_ps(f, vtimes);
        if (nan) {  // (rare: a branch, not a blend per chunk) the code's sign, whatever the scale's
            const __m512i sign = _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16), sign32);
            f = _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, qnan)));
        }
        _mm512_storeu_ps(dst + d, f);
    }
    return d;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// Integer rows of up to 256 elements and 8 groups, sixteen elements at a time whatever the
// groups: each lane's scale and minimum are picked from the row's meta (one register: the
// groups' (scale, minimum) pairs) by an index fixed for the row layout, then kv_load_int's
// multiply and add lane by lane. The last chunk of a row is masked. Returns false (nothing
// decoded) for a longer row. dst: [n_rows, n].
bool decode_int_rows_avx512(int bits, const char* src, std::int64_t row_bytes, int n_rows, int n, int group,
                            float* dst) {
    const int n_groups = n / group, n_chunks = (n + 15) / 16;
    if (n > 256 || n_groups > 8) return false;
    __m512i scale_of[16], min_of[16];  // [n_chunks] per lane, the index of its group's scale and minimum
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int c = 0; c < n_chunks; c++) {
        // element / group, exactly: a quotient of integers below 2^8 rounds to the integer it is,
        // or stays more than 1/group below the next one (far above its rounding error)
        const __m512 e =
            _mm512_min_ps(_mm512_add_ps(lane, _mm512_set1_ps(float(16 * c))), _mm512_set1_ps(float(n - 1)));
        const __m512i g = _mm512_cvttps_epi32(_mm512_div_ps(e, _mm512_set1_ps(float(group))));
        scale_of[c] = _mm512_add_epi32(g, g), min_of[c] = _mm512_add_epi32(scale_of[c], _mm512_set1_epi32(1));
    }
    const __mmask16 meta_mask = __mmask16((1u << (2 * n_groups)) - 1);
    const __mmask16 last = __mmask16((1u << (n - 16 * (n_chunks - 1))) - 1);  // lanes of the last chunk
    const __m512i shift = _mm512_set4_epi32(4, 0, 4, 0), low4 = _mm512_set1_epi32(0x0f);
    const __m128i twice_of = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int i = 0; i < n_rows; i++, src += row_bytes, dst += n) {
        const __m512 meta = _mm512_maskz_loadu_ps(meta_mask, src);  // s0, m0, s1, m1, ...
        const std::uint8_t* codes = kv_int_codes(src, n, group);
        for (int c = 0; c < n_chunks; c++) {
            const __mmask16 lanes = c + 1 < n_chunks ? __mmask16(0xffff) : last;
            __m512i code;
            if (bits == 8) {
                code = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, codes + 16 * c));
            } else {  // eight bytes hold sixteen codes: each byte twice, then its low and high nibble
                const __mmask16 bytes = __mmask16((1u << ((std::popcount(unsigned(lanes)) + 1) / 2)) - 1);
                const __m128i twice = _mm_shuffle_epi8(_mm_maskz_loadu_epi8(bytes, codes + 8 * c), twice_of);
                code = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(twice), shift), low4);
            }
            const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(code), _mm512_permutexvar_ps(scale_of[c], meta));
            _mm512_mask_storeu_ps(dst + 16 * c, lanes, _mm512_add_ps(x, _mm512_permutexvar_ps(min_of[c], meta)));
        }
    }
    return true;
}
#endif

// Integer rows, row_bytes apart, group by group: kv_load_int's arithmetic (code * scale + min,
// one multiply and one add each, no contraction), sixteen or eight codes at a time where the
// build has AVX-512 or AVX2. dst: [n_rows, n].
void decode_int_rows(int format, const char* src, std::int64_t row_bytes, int n_rows, int n, int group, float* dst) {
    const int bits = kv_int_bits(format), n_groups = n / group;
    assert(std::int64_t(n_groups) * group == n);  // a group never straddles rows
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    if (decode_int_rows_avx512(bits, src, row_bytes, n_rows, n, group, dst)) return;
#endif
    for (int i = 0; i < n_rows; i++, src += row_bytes, dst += n) {
        const std::uint8_t* codes = kv_int_codes(src, n, group);
        for (int gi = 0; gi < n_groups; gi++) {
            float meta[2];  // the group's scale and minimum
            std::memcpy(meta, src + 8 * std::size_t(gi), sizeof meta);
            const float scale = meta[0], min = meta[1];
            int j = gi * group;
            const int end = j + group;
#if defined(__AVX2__)
            const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(min);
            if (bits == 8) {
                for (; j + 8 <= end; j += 8) {
                    const __m256i c =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j)));
                    _mm256_storeu_ps(dst + j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), vs), vm));
                }
            } else if (j % 2 == 0) {
                // Four bytes hold codes j..j+7, as above.
                const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), low4 = _mm256_set1_epi32(0x0f);
                const __m128i twice_of = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1);
                for (; j + 8 <= end; j += 8) {
                    std::uint32_t four;
                    std::memcpy(&four, codes + j / 2, sizeof four);
                    const __m128i twice = _mm_shuffle_epi8(_mm_cvtsi32_si128(int(four)), twice_of);
                    const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(twice), shift), low4);
                    _mm256_storeu_ps(dst + j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c), vs), vm));
                }
            }
#endif
            for (; j < end; j++) {
                const unsigned code = bits == 8 ? codes[j] : (j % 2 == 0 ? codes[j / 2] & 0x0fu : codes[j / 2] >> 4u);
                dst[j] = float(code) * scale + min;
            }
        }
    }
}

}  // namespace

void decode_kv_row(int format, const void* src, int n, float scale, float* dst, int group) {
    if (kv_format_int(format)) {
        decode_int_rows(format, static_cast<const char*>(src), 0, 1, n, group, dst);
        return;
    }
    switch (format) {
        case int(KVFormat::fp32): std::copy_n(static_cast<const float*>(src), n, dst); return;
        case int(KVFormat::bf16): {
            const auto* c = static_cast<const std::uint16_t*>(src);
            for (int d = 0; d < n; d++) {
                // fp32's top half; a NaN is decode_float's quiet NaN (the payload is not kept)
                const std::uint32_t u = std::uint32_t(c[d]) << 16;
                dst[d] = float_from_bits((u & 0x7fffffffu) > 0x7f800000u ? (u & 0x80000000u) | 0x7fc00000u : u);
            }
            return;
        }
        case int(KVFormat::fp16): {
            int d = 0;  // (fp16 has no scale)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
            d = decode_half_avx512<KVFormat::fp16>(src, n, 1.0f, dst);
#endif
            decode_row(static_cast<const std::uint16_t*>(src) + d, n - d, dst + d, 0x7fffu, 13, 0x1p112f, 0x7c00u,
                       true);
            return;
        }
        default: {  // fp8: sixteen or eight codes at a time where the build has AVX-512 or AVX2
            const auto* c = static_cast<const std::uint8_t*>(src);
            const bool e5m2 = format == int(KVFormat::fp8_e5m2);
            int d = 0, scaled = 0;  // elements decoded; how many of them are scaled
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
            d = scaled = e5m2 ? decode_half_avx512<KVFormat::fp8_e5m2>(c, n, scale, dst)
                              : decode_half_avx512<KVFormat::fp8_e4m3>(c, n, scale, dst);
#endif
#if defined(__AVX2__)
            d += e5m2 ? decode_fp8_avx2<2, 15, true>(c + d, n - d, dst + d)
                      : decode_fp8_avx2<3, 7, false>(c + d, n - d, dst + d);
#endif
            if (e5m2)
                decode_row(c + d, n - d, dst + d, 0x7fu, 21, 0x1p112f, 0x7cu, true);
            else
                decode_row(c + d, n - d, dst + d, 0x7fu, 20, 0x1p120f, 0x7fu, false);
            dst += scaled, n -= scaled;
        }
    }
    // kv_load's multiply by the scale, where not done above (by 1 the product is the value itself: skipped)
    if (scale != 1.0f)
        for (int d = 0; d < n; d++) dst[d] = dst[d] * scale;
}

void decode_kv_rows(int format, const void* src, std::int64_t row_bytes, int n_rows, int n, float scale, float* dst,
                    int group) {
    if (kv_format_int(format)) {
        decode_int_rows(format, static_cast<const char*>(src), row_bytes, n_rows, n, group, dst);
        return;
    }
    if (row_bytes == std::int64_t(n) * kv_format_bytes(format)) {
        decode_kv_row(format, src, n_rows * n, scale, dst, group);
        return;
    }
    for (int i = 0; i < n_rows; i++)
        decode_kv_row(format, static_cast<const char*>(src) + i * row_bytes, n, scale, dst + std::int64_t(i) * n,
                      group);
}

AttentionSpec parse_attention(std::string_view kind, int tile) {
    AttentionSpec a;
    if (kind == "tiled")
        a.kind = AttentionSpec::Kind::tiled;
    else if (kind != "simple")
        throw Error(fmt::format("unknown attention '{}' (simple, tiled)", kind));
    if (tile < 1 || tile > AttentionSpec::kMaxTile)
        throw Error(fmt::format("attention tile {} is out of range (1..{} keys)", tile, AttentionSpec::kMaxTile));
    a.tile = tile;
    return a;
}

std::string attention_name(const AttentionSpec& a) {
    return a.tiled() ? fmt::format("tiled (tile {})", a.tile) : std::string("simple");
}

}  // namespace kvlab
