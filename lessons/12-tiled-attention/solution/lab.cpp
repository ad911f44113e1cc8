// Lab 12, a reference solution: the tiled attention of core/tiled_attention.h and core/kernels.h
// (tiled_attention_row), written out plainly.
#include "lab.h"

#include <cmath>
#include <limits>
#include <vector>

#include "grader.h"
#include "numerics.h"

namespace kvlab::lab12 {

void tiled_attention(float* out, const float* q, const float* k, const float* v, int n, int head_size, int tile,
                     int rows) {
    (void)rows;  // the tiles are fixed in key-index space
    const float scale = std::sqrt(float(head_size));
    std::vector<float> e(static_cast<std::size_t>(tile));       // [tile] the tile's scores, then its weights
    std::vector<float> o(static_cast<std::size_t>(head_size));  // [head_size] the tile's o_j
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int t1 = t0 + tile < n ? t0 + tile : n;
        // The tile's partial: its own maximum, weights, their sum and o_j, t ascending from 0.
        for (int t = t0; t < t1; t++) {
            float s = 0.0f;
            for (int d = 0; d < head_size; d++) s = s + q[d] * k[t * head_size + d];
            e[std::size_t(t - t0)] = s / scale;
        }
        float m_j = e[0];
        for (int t = 1; t < t1 - t0; t++)
            if (e[std::size_t(t)] > m_j) m_j = e[std::size_t(t)];
        float l_j = 0.0f;
        for (int t = 0; t < t1 - t0; t++) {
            e[std::size_t(t)] = exp_f32(e[std::size_t(t)] - m_j);
            l_j = l_j + e[std::size_t(t)];
        }
        for (int d = 0; d < head_size; d++) {
            float x = 0.0f;
            for (int t = t0; t < t1; t++) x = x + e[std::size_t(t - t0)] * v[t * head_size + d];
            o[std::size_t(d)] = x;
        }
        // Folded into the running state, in tile order: both sides rescaled to the new maximum.
        const float m_new = m_j > m ? m_j : m;
        const float a = exp_f32(m - m_new), b = exp_f32(m_j - m_new);
        l = l * a + l_j * b;
        for (int d = 0; d < head_size; d++) out[d] = out[d] * a + o[std::size_t(d)] * b;
        m = m_new;
    }
    for (int d = 0; d < head_size; d++) out[d] = out[d] / l;
}

}  // namespace kvlab::lab12
