// expect: your fast_matmul differs from the textbook loop
// A plausible mistake: split-K disguised as tiling. k runs in tiles of 4, each tile summed into
// its own partial from +0, the partials added at the end: cache-friendly, and every output the
// exact dot product in real arithmetic; in float, another order. Used for both functions.
#include <algorithm>

#include "lab.h"

namespace kvlab::lab04 {

namespace {
constexpr int kTile = 4;  // k per tile
void k_tiled(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
             int n_out) {
    ex.flops += 2ull * std::uint64_t(rows) * std::uint64_t(n_in) * std::uint64_t(n_out);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < n_out; o++) {
            float total = 0.0f;
            for (int k0 = 0; k0 < n_in; k0 += kTile) {
                float part = 0.0f;  // the bug: a partial sum per tile of k
                for (int k = k0; k < std::min(n_in, k0 + kTile); k++)
                    part = part + x[std::int64_t(r) * ldx + k] * w[std::int64_t(k) * ldw + o];
                total = total + part;
            }
            y[std::int64_t(r) * ldy + o] = total;
        }
}
}  // namespace

void fast_matmul(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows, int n_in,
                 int n_out) {
    k_tiled(ex, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}

void planted_split_k(Exec& ex, float* y, int ldy, const float* x, int ldx, const float* w, int ldw, int rows,
                     int n_in, int n_out) {
    k_tiled(ex, y, ldy, x, ldx, w, ldw, rows, n_in, n_out);
}

}  // namespace kvlab::lab04
