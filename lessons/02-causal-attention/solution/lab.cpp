// Lab 2, reference solution: naive attention of one head written out as loops, in exactly the
// order of kvlab's kernel (CpuBackend::causal_attention in core/cpu_backend.cpp): each score a
// dot product summed over d from +0, divided by sqrt(head_size), -inf past the mask; kvlab's
// softmax by row; each output a sum over all T columns of P in increasing j (the masked ones
// add exact zeros).
#include "lab.h"

#include <cassert>
#include <limits>
#include <vector>

#include "kernels.h"

namespace kvlab::lab02 {

void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size) {
    assert(T >= 1 && head_size >= 1 && ldo >= head_size && ldq >= head_size && ldk >= head_size && ldv >= head_size);
    const float scale = attention_scale(head_size);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    std::vector<float> p(static_cast<std::size_t>(T));  // [T] row i of S, then of P
    for (int i = 0; i < T; i++) {
        const float* qi = q + std::size_t(i) * ldq;
        for (int j = 0; j < T; j++) {
            if (j > i) {  // the causal mask: position j is in row i's future
                p[std::size_t(j)] = neg_inf;
                continue;
            }
            const float* kj = k + std::size_t(j) * ldk;
            float s = 0.0f;
            for (int d = 0; d < head_size; d++) s = s + qi[d] * kj[d];
            p[std::size_t(j)] = s / scale;
        }
        softmax(p.data(), T);
        float* oi = out + std::size_t(i) * ldo;
        for (int d = 0; d < head_size; d++) {
            float acc = 0.0f;
            for (int j = 0; j < T; j++) acc = acc + p[std::size_t(j)] * v[std::size_t(j) * ldv + d];
            oi[d] = acc;
        }
    }
}

}  // namespace kvlab::lab02
