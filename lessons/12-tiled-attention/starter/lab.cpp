// Lab 12: tiled attention. Fill in the TODO; `lessons/grade 12` grades this file.
//
// Attention of one query row over n keys, tile by tile (README.md):
//   for each key tile j (keys j*tile .. j*tile + tile - 1, the last one cut at n):
//     s_t = (q . k_t) / sqrt(head_size)           every d ascending, from +0
//     m_j = the tile's largest s_t                 scanned from its first key
//     e_t = exp_f32(s_t - m_j),  l_j = sum e_t,  o_j[d] = sum e_t v_t[d]     t ascending, from +0
//     fold it into the running (m, l, out), which starts at (-inf, 0, 0):
//       m' = max(m, m_j),  a = exp_f32(m - m'),  b = exp_f32(m_j - m')
//       l' = l a + l_j b,  out'[d] = out[d] a + o_j[d] b
//   out[d] = out[d] / l
// exp_f32 is kvlab's e^x (core/numerics.h): use it, not std::exp, so that every path agrees.
#include "lab.h"

#include "grader.h"
#include "numerics.h"

namespace kvlab::lab12 {

// TODO: the tiled attention above. Hint: which of the arguments may decide where a tile starts?
void tiled_attention(float* out, const float* q, const float* k, const float* v, int n, int head_size, int tile,
                     int rows) {
    (void)out, (void)q, (void)k, (void)v, (void)n, (void)head_size, (void)tile, (void)rows;
    throw lessons::NotImplemented("tiled_attention");
}

}  // namespace kvlab::lab12
