// expect: no counterexample
// A plausible mistake: the planted split-K that does not split. It loops over the chunks but
// carries one running sum through them, so every output keeps the textbook order: nothing for
// the grader to catch, and nothing learned about why order matters.
#include "lab.h"

namespace kvlab::lab04 {

void fast_matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                 int n_out) {
    matmul(ex, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}

void planted_split_k(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                     int n_in, int n_out) {
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    const int parts = ex.n_threads;
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            float s = 0.0f;  // the bug: one sum for all chunks, so the chunks change nothing
            for (int p = 0; p < parts; p++)
                for (int k = n_in * p / parts; k < n_in * (p + 1) / parts; k++)
                    s = s + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
            y[std::int64_t(r) * ldy + o] = s;
        }
}

}  // namespace kvlab::lab04
