// expect: inside each layer
// A plausible mistake: naive decode's attention counted like the cached step's, one query row
// over T positions, when naive decode recomputes every row: T query rows, a T x T score matrix.
#include "lab.h"

#include "kernels.h"

namespace kvlab::lab01 {

namespace {
using u64 = std::uint64_t;
u64 matmul(u64 rows, u64 n_in, u64 n_out) { return 2 * rows * n_in * n_out; }
u64 rmsnorm(u64 rows, u64 dim) { return rows * (5 * dim + 4); }
u64 rope(const Config& c, u64 rows, u64 heads) { return 6 * rows * heads * u64(c.head_size() / 2); }
u64 layer_rowwise(const Config& c, u64 rows) {
    const u64 dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    return 2 * rmsnorm(rows, dim) + 2 * matmul(rows, dim, dim) + 2 * matmul(rows, dim, kv_dim) +
           rope(c, rows, c.n_heads) + rope(c, rows, c.n_kv_heads) + 2 * rows * dim + 2 * matmul(rows, dim, hidden) +
           5 * rows * hidden + matmul(rows, hidden, dim);
}
u64 outside_layers(const Config& c) { return rmsnorm(1, c.dim) + matmul(1, c.dim, c.vocab_size); }
}  // namespace

std::uint64_t naive_step_flops(const Config& c, int T) {
    // The bug: one row's attention over T positions, not T rows of a T x T matrix.
    return c.n_layers * (layer_rowwise(c, T) + c.n_heads * attention_row_flops(c.head_size(), T)) + outside_layers(c);
}

std::uint64_t cached_step_flops(const Config& c, int T) {
    return c.n_layers * (layer_rowwise(c, 1) + c.n_heads * attention_row_flops(c.head_size(), T)) + outside_layers(c);
}

std::uint64_t prefill_flops(const Config& c, int P) {
    u64 attention = 0;
    for (int n = 1; n <= P; n++) attention += c.n_heads * attention_row_flops(c.head_size(), n);
    return c.n_layers * (layer_rowwise(c, P) + attention) + outside_layers(c);
}

}  // namespace kvlab::lab01
