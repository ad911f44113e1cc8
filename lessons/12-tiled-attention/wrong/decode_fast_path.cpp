// expect: differ
// A decode fast path: a one-row step skips the tiles and runs one plain softmax over all its keys
// (correct attention, and a tempting shortcut), while prefill steps run the tiles. The same row
// then gets other bits decoded than prefilled.
#include <cmath>
#include <limits>
#include <vector>

#include "grader.h"
#include "lab.h"
#include "numerics.h"

namespace kvlab::lab12 {

namespace {

void tiles(float* out, const float* q, const float* k, const float* v, int n, int head_size, int tile) {
    const float scale = std::sqrt(float(head_size));
    std::vector<float> e(static_cast<std::size_t>(tile));       // [tile]
    std::vector<float> o(static_cast<std::size_t>(head_size));  // [head_size]
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    for (int d = 0; d < head_size; d++) out[d] = 0.0f;
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int t1 = t0 + tile < n ? t0 + tile : n;
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
        const float m_new = m_j > m ? m_j : m;
        const float a = exp_f32(m - m_new), b = exp_f32(m_j - m_new);
        l = l * a + l_j * b;
        for (int d = 0; d < head_size; d++) out[d] = out[d] * a + o[std::size_t(d)] * b;
        m = m_new;
    }
    for (int d = 0; d < head_size; d++) out[d] = out[d] / l;
}

}  // namespace

void tiled_attention(float* out, const float* q, const float* k, const float* v, int n, int head_size, int tile,
                     int rows) {
    if (rows > 1) return tiles(out, q, k, v, n, head_size, tile);
    // The mistake: a one-row step's "faster" path, one softmax over every key.
    const float scale = std::sqrt(float(head_size));
    std::vector<float> p(static_cast<std::size_t>(n));  // [n]
    float m = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int t = 0; t < n; t++) {
        float s = 0.0f;
        for (int d = 0; d < head_size; d++) s = s + q[d] * k[t * head_size + d];
        p[std::size_t(t)] = s / scale;
        if (p[std::size_t(t)] > m) m = p[std::size_t(t)];
    }
    for (float& x : p) sum = sum + (x = exp_f32(x - m));
    for (int d = 0; d < head_size; d++) {
        float x = 0.0f;
        for (int t = 0; t < n; t++) x = x + p[std::size_t(t)] / sum * v[t * head_size + d];
        out[d] = x;
    }
}

}  // namespace kvlab::lab12
