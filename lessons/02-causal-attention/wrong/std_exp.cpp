// expect: differs from kvlab's naive attention
// A plausible mistake: everything in kvlab's order, but the softmax calls the C library's
// std::exp instead of exp_f32. Both are within an ulp of e^x; they do not round alike.
#include <cmath>
#include <vector>

#include "lab.h"

namespace kvlab::lab02 {

void causal_attention_head(float* out, int ldo, const float* q, int ldq, const float* k, int ldk, const float* v,
                           int ldv, int T, int head_size) {
    const float scale = std::sqrt(float(head_size));
    std::vector<float> p(static_cast<std::size_t>(T));  // one row of scores, then of weights: [T]
    for (int i = 0; i < T; i++) {
        for (int j = 0; j <= i; j++) {  // j > i: -inf, weight +0, adds nothing
            float s = 0.0f;
            for (int d = 0; d < head_size; d++) s = s + q[std::size_t(i) * ldq + d] * k[std::size_t(j) * ldk + d];
            p[std::size_t(j)] = s / scale;
        }
        float max = p[0];
        for (int j = 1; j <= i; j++)
            if (p[std::size_t(j)] > max) max = p[std::size_t(j)];
        float sum = 0.0f;
        for (int j = 0; j <= i; j++) {
            p[std::size_t(j)] = std::exp(p[std::size_t(j)] - max);  // the bug: libm's rounding, not kvlab's
            sum = sum + p[std::size_t(j)];
        }
        for (int j = 0; j <= i; j++) p[std::size_t(j)] = p[std::size_t(j)] / sum;
        for (int d = 0; d < head_size; d++) {
            float o = 0.0f;
            for (int j = 0; j <= i; j++) o = o + p[std::size_t(j)] * v[std::size_t(j) * ldv + d];
            out[std::size_t(i) * ldo + d] = o;
        }
    }
}

}  // namespace kvlab::lab02
