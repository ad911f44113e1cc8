// expect: the causal mask
// A plausible mistake: the mask hides j > i + 1 instead of j > i, so row i also sees the next
// position. Here kvlab's own kernel with its planted bug switched on (future = 1).
#include <algorithm>
#include <vector>

#include "cpu_backend.h"
#include "lab.h"

namespace kvlab::lab02 {

void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size) {
    Config c;
    c.dim = head_size, c.n_heads = c.n_kv_heads = 1, c.max_seq = T;
    c.hidden_dim = c.n_layers = c.vocab_size = 1;
    const Model model{Weights(c)};
    CpuBackend backend(model);
    const std::size_t n = std::size_t(T) * head_size;  // q, k, v, att: [T, head_size]
    std::vector<float> qp(n), kp(n), vp(n), att(n);
    for (int i = 0; i < T; i++) {
        std::copy_n(q + std::size_t(i) * ldq, head_size, qp.begin() + std::ptrdiff_t(i) * head_size);
        std::copy_n(k + std::size_t(i) * ldk, head_size, kp.begin() + std::ptrdiff_t(i) * head_size);
        std::copy_n(v + std::size_t(i) * ldv, head_size, vp.begin() + std::ptrdiff_t(i) * head_size);
    }
    const int kv_head = 0;
    Exec ex;
    backend.causal_attention(ex, att.data(), qp.data(), kp.data(), vp.data(), T, &kv_head, /*future=*/1);  // the bug
    for (int i = 0; i < T; i++)
        std::copy_n(att.begin() + std::ptrdiff_t(i) * head_size, head_size, out + std::size_t(i) * ldo);
}

}  // namespace kvlab::lab02
