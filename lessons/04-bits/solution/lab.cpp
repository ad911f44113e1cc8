// Lab 4, reference solution. fast_matmul is kvlab's own fast product (kernels.cpp: matmul, tiles
// of 4 rows x 2 vector registers of outputs, threads over tiles, each lane summing its own k in
// order). planted_split_k has no counterpart in core (core must never split a sum): it is here.
#include <cassert>
#include <vector>

#include "lab.h"

namespace kvlab::lab04 {

void fast_matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                 int n_out) {
    matmul(ex, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}

void planted_split_k(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                     int n_in, int n_out) {
    assert(rows >= 0 && n_in >= 0 && n_out >= 0 && ldy >= n_out && ldx >= n_in && ldw >= n_out);
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    const int parts = ex.n_threads;  // chunk p is k in [n_in * p / parts, n_in * (p + 1) / parts)
    std::vector<float> partial(static_cast<std::size_t>(parts));  // [parts]: one element's partial sums
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            for (int p = 0; p < parts; p++) {  // what thread p would sum on its own
                float s = 0.0f;
                for (int k = n_in * p / parts; k < n_in * (p + 1) / parts; k++)
                    s = s + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
                partial[std::size_t(p)] = s;
            }
            float total = 0.0f;  // the reduction at the end: a different order of the same terms
            for (float s : partial) total = total + s;
            y[std::int64_t(r) * ldy + o] = total;
        }
}

}  // namespace kvlab::lab04
