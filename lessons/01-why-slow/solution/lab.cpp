// Lab 1, reference solution. Core has no whole-step FLOP formula (the decoders only count as
// they run), so it lives here; the per-kernel costs it is built from are the kernels' own
// (core/kernels.cpp), and where kernels.h exposes one (attention_row_flops, softmax_flops) this
// file calls it.
#include "lab.h"

#include <cassert>

#include "kernels.h"

namespace kvlab::lab01 {

namespace {

using u64 = std::uint64_t;

// What each kernel adds to Exec::flops (kernels.cpp).
u64 matmul(u64 rows, u64 n_in, u64 n_out) { return 2 * rows * n_in * n_out; }  // a multiply and an add each
u64 rmsnorm(u64 rows, u64 dim) { return rows * (5 * dim + 4); }
// 6 per (row, head, pair); an odd head_size leaves its last element unrotated.
u64 rope(const Config& c, u64 rows, u64 heads) { return 6 * rows * heads * u64(c.head_size() / 2); }

// One layer on `rows` rows, all but attention: the same code for both decoders (decode.cpp).
u64 layer_rowwise(const Config& c, u64 rows) {
    const u64 dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    u64 f = rmsnorm(rows, dim);
    f += matmul(rows, dim, dim) + 2 * matmul(rows, dim, kv_dim);  // q; k and v
    f += rope(c, rows, c.n_heads) + rope(c, rows, c.n_kv_heads);   // q and k
    f += matmul(rows, dim, dim) + rows * dim;                      // wo, residual add
    f += rmsnorm(rows, dim);
    f += 2 * matmul(rows, dim, hidden) + 5 * rows * hidden;  // w1 and w3, silu_mul
    f += matmul(rows, hidden, dim) + rows * dim;             // w2, residual add
    return f;
}

// The final rmsnorm and the classifier, on one row (the last), for every decoder.
u64 outside_layers(const Config& c) { return rmsnorm(1, c.dim) + matmul(1, c.dim, c.vocab_size); }

// One head of naive attention over T rows (CpuBackend::causal_attention): S = Q K^T and P V are
// full T x T products, the scale divides only the unmasked entries, softmax runs over whole rows.
u64 causal_attention_head(u64 T, u64 head_size) {
    return matmul(T, head_size, T) + T * (T + 1) / 2 + T * softmax_flops(int(T)) + matmul(T, T, head_size);
}

}  // namespace

std::uint64_t naive_step_flops(const Config& c, int T) {
    assert(T >= 1 && T <= c.max_seq);
    const u64 attention = u64(c.n_heads) * causal_attention_head(T, c.head_size());
    return u64(c.n_layers) * (layer_rowwise(c, T) + attention) + outside_layers(c);
}

std::uint64_t cached_step_flops(const Config& c, int T) {
    assert(T >= 1 && T <= c.max_seq);
    const u64 attention = u64(c.n_heads) * attention_row_flops(c.head_size(), T);
    return u64(c.n_layers) * (layer_rowwise(c, 1) + attention) + outside_layers(c);
}

std::uint64_t prefill_flops(const Config& c, int P) {
    assert(P >= 1 && P <= c.max_seq);
    u64 attention = 0;  // row i reads positions 0..i
    for (int n = 1; n <= P; n++) attention += u64(c.n_heads) * attention_row_flops(c.head_size(), n);
    return u64(c.n_layers) * (layer_rowwise(c, P) + attention) + outside_layers(c);
}

}  // namespace kvlab::lab01
