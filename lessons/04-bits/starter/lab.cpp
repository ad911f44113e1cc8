// Lab 4: why the bits agree, and how to break them. Fill in the two TODOs; `lessons/grade 4`
// grades this file.
//
// Shapes (row strides in floats, wider than the rows: a row may be a column block of a wider
// matrix, and the floats past n_out in a row of Y belong to someone else):
//   X [rows, n_in]   element (r, k) at x[r * ldx + k]
//   W [n_in, n_out]  element (k, o) at w[k * ldw + o]
//   Y [rows, n_out]  element (r, o) at y[r * ldy + o]
// The textbook loop (kernels.cpp: matmul_reference) is the order every Y[r][o] must keep:
//   float s = 0.0f; for (k = 0; k < n_in; k++) s = s + X[r][k] * W[k][o]; Y[r][o] = s;
// OpenMP (#pragma omp parallel for num_threads(ex.n_threads)) and xsimd are available.
#include <cassert>

#include "grader.h"
#include "lab.h"

namespace kvlab::lab04 {

// TODO 1: a faster product with the textbook loop's bits. Ideas, in the order they pay off:
//   - tiles: a block of R rows x C columns of Y in local accumulators, k running outermost over
//     the tile, so each W row segment is read once per tile instead of once per output;
//   - vectors across outputs: C adjacent columns of one row are C independent sums, so one
//     vector register can hold them (each lane still adds its own k in order);
//   - threads across tiles (never across k).
// Add 2 * rows * n_in * n_out to ex.flops.
void fast_matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                 int n_out) {
    assert(rows >= 0 && n_in >= 0 && n_out >= 0 && ldy >= n_out && ldx >= n_in && ldw >= n_out);
    (void)ex, (void)y, (void)ldy, (void)x, (void)ldx, (void)w, (void)ldw, (void)rows, (void)n_in, (void)n_out;
    throw lessons::NotImplemented("fast_matmul");
}

// TODO 2: plant the bug. The same product, split-K: chunk p of P = ex.n_threads chunks is
// k in [n_in * p / P, n_in * (p + 1) / P); each chunk summed from +0 on its own (as thread p
// would), then total = ((0 + partial_0) + partial_1) + ... Every output is still the exact dot
// product in real arithmetic. Add 2 * rows * n_in * n_out to ex.flops.
void planted_split_k(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                     int n_in, int n_out) {
    assert(rows >= 0 && n_in >= 0 && n_out >= 0 && ldy >= n_out && ldx >= n_in && ldw >= n_out);
    (void)ex, (void)y, (void)ldy, (void)x, (void)ldx, (void)w, (void)ldw, (void)rows, (void)n_in, (void)n_out;
    throw lessons::NotImplemented("planted_split_k");
}

}  // namespace kvlab::lab04
