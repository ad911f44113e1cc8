// Lab 2: causal attention, naively. Fill in the TODO; `lessons/grade 2` grades this file.
//
// One head, T positions, as matrices (row i of each is position i):
//   q, k, v  [T, head_size]  row i at q + i * ldq, k + i * ldk, v + i * ldv
//   S        [T, T]          S[i][j] = (q_i . k_j) / sqrt(head_size) for j <= i, -inf for j > i
//   P        [T, T]          softmax of each row of S
//   out      [T, head_size]  out_i = sum_j P[i][j] v_j, row i at out + i * ldo
// Bit for bit means the same operations in the same order as kvlab (README.md, "The order"):
//   - every sum starts at +0.0f and adds its terms in increasing index (d for q . k, j for P V);
//   - divide by std::sqrt(float(head_size)); do not multiply by its reciprocal;
//   - softmax: the row maximum, then e = exp_f32(s - max) (numerics.h, never std::exp), summed in
//     increasing j, then each e divided by the sum.
// Masked entries may be skipped: exp_f32(-inf) is +0, and adding +0 changes no sum (NUMERICS.md).
#include <cassert>
#include <cmath>
#include <vector>

#include "grader.h"
#include "lab.h"
#include "numerics.h"

namespace kvlab::lab02 {

void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size) {
    assert(T >= 1 && ldo >= head_size && ldq >= head_size && ldk >= head_size && ldv >= head_size);
    // TODO: for each row i: the scores of positions 0..i, softmax, then P V into out row i.
    (void)out, (void)ldo, (void)q, (void)ldq, (void)k, (void)ldk, (void)v, (void)ldv, (void)T, (void)head_size;
    throw lessons::NotImplemented("causal_attention_head");
}

}  // namespace kvlab::lab02
