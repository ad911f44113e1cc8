// Lab 2, reference solution: kvlab's own naive attention (CpuBackend::causal_attention, in
// core/cpu_backend.cpp: S = Q K^T as a product, the scale and the mask, softmax by row, P V),
// run on a one-head model whose dim is head_size. It reads only q, k and v, never the weights,
// so they stay zero.
#include <algorithm>
#include <cassert>
#include <vector>

#include "cpu_backend.h"
#include "lab.h"

namespace kvlab::lab02 {

void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size) {
    assert(T >= 1 && head_size >= 1 && ldo >= head_size && ldq >= head_size && ldk >= head_size && ldv >= head_size);
    Config c;
    c.dim = head_size, c.n_heads = c.n_kv_heads = 1, c.max_seq = T;
    c.hidden_dim = c.n_layers = c.vocab_size = 1;
    const Model model{Weights(c)};
    CpuBackend backend(model);
    // The backend takes one head's rows packed: q, k, v, att: [T, head_size].
    const std::size_t n = std::size_t(T) * head_size;
    std::vector<float> qp(n), kp(n), vp(n), att(n);
    for (int i = 0; i < T; i++) {
        std::copy_n(q + std::size_t(i) * ldq, head_size, qp.begin() + std::ptrdiff_t(i) * head_size);
        std::copy_n(k + std::size_t(i) * ldk, head_size, kp.begin() + std::ptrdiff_t(i) * head_size);
        std::copy_n(v + std::size_t(i) * ldv, head_size, vp.begin() + std::ptrdiff_t(i) * head_size);
    }
    assert(qp.size() == n && att.size() == n);
    const int kv_head = 0;  // query head 0 reads KV head 0
    Exec ex;
    backend.causal_attention(ex, att.data(), qp.data(), kp.data(), vp.data(), T, &kv_head, /*future=*/0);
    for (int i = 0; i < T; i++)
        std::copy_n(att.begin() + std::ptrdiff_t(i) * head_size, head_size, out + std::size_t(i) * ldo);
}

}  // namespace kvlab::lab02
