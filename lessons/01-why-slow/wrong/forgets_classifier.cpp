// expect: outside the layers
// A plausible mistake: every layer counted right, but the step ends at the last layer; the
// final rmsnorm is there, the classifier's product (dim x vocab_size, on the last row) is not.
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
u64 outside_layers(const Config& c) { return rmsnorm(1, c.dim); }  // the bug: no classifier
}  // namespace

std::uint64_t naive_step_flops(const Config& c, int T) {
    const u64 t = T, hs = c.head_size();
    const u64 head = matmul(t, hs, t) + t * (t + 1) / 2 + t * softmax_flops(T) + matmul(t, t, hs);
    return c.n_layers * (layer_rowwise(c, t) + c.n_heads * head) + outside_layers(c);
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
