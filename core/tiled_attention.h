// kvlab core: tiled attention's arithmetic, one source for the CPU kernels (kernels.h) and the
// GPU's per-thread code (gpu/kernels.h).
//
// Tiled attention is FlashAttention's online softmax over key tiles, and flash-decoding's split
// of the keys, written so that it stays exact (NUMERICS.md, "Tiled attention"). Key tile j holds
// the logical positions j*tile .. j*tile + tile - 1: its boundaries depend on nothing but the key
// index and the tile size, never on the query rows, the chunk, the batch, the thread count or
// the number of keys. For one query row over n keys, each tile computes its partial alone
//   m_j = max s_t (scanned from its first key),  e_t = exp(s_t - m_j),
//   l_j = sum e_t,  o_j[d] = sum e_t v_t[d]       (t ascending from +0)
// and the partials are folded in tile order from (m, l, o) = (-inf, 0, 0):
//   m' = max(m, m_j),  a = exp(m - m'),  b = exp(m_j - m'),
//   l' = l a + l_j b,  o'[d] = o[d] a + o_j[d] b
// then out[d] = o[d] / l. A query at position p reads keys 0..p, so its last tile is cut at p
// (masked keys are never visited). Prefill, chunked prefill, decode and naive decode all run
// exactly this; only which thread computes a partial differs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "numerics.h"

namespace kvlab {

struct AttentionSpec {
    enum class Kind : std::uint8_t { simple, tiled };
    // simple: one softmax over the whole row (kernels.h attention_row); tiled: the above.
    Kind kind = Kind::simple;
    int tile = 64;  // keys per tile (tiled)
    // The largest tile: a GPU thread keeps one tile's weights in a local array of this size.
    static constexpr int kMaxTile = 256;
    bool tiled() const { return kind == Kind::tiled; }
    bool operator==(const AttentionSpec&) const = default;
};

// "simple" or "tiled" with a tile of 1..kMaxTile keys; anything else throws Error (one line).
AttentionSpec parse_attention(std::string_view kind, int tile);
// "simple", or "tiled (tile 64)".
std::string attention_name(const AttentionSpec& a);

KVLAB_HD inline int tile_count(int n, int tile) { return (n + tile - 1) / tile; }

// A tile's partial (m_j, l_j), or the running fold of the tiles before it.
struct TileStats {
    float m, l;
};
KVLAB_HD inline TileStats tile_fold_start() { return {float_from_bits(0xff800000u), 0.0f}; }  // (-inf, 0)

// Folding tile j into the running state: the new state, and the factors a (for the state's o)
// and b (for the tile's o_j): o'[d] = o[d] * a + o_j[d] * b.
struct TileFold {
    TileStats next;
    float a, b;
};
KVLAB_HD inline TileFold tile_fold(TileStats acc, TileStats tile) {
    const float m = tile.m > acc.m ? tile.m : acc.m;
    const float a = exp_f32(acc.m - m), b = exp_f32(tile.m - m);
    return {{m, acc.l * a + tile.l * b}, a, b};
}
KVLAB_HD inline float tile_fold_o(float o, float o_tile, const TileFold& f) { return o * f.a + o_tile * f.b; }

// The largest of e[0..n) scanned from e[0] (as softmax's max), then e[t] = exp(e[t] - max) and
// their sum in t order from +0: a tile's (m_j, l_j), its weights left in e.
KVLAB_HD inline TileStats tile_weights(float* e, int n) {
    float m = e[0];
    for (int t = 1; t < n; t++)
        if (e[t] > m) m = e[t];
    float l = 0.0f;
    for (int t = 0; t < n; t++) {
        e[t] = exp_f32(e[t] - m);
        l = l + e[t];
    }
    return {m, l};
}

// Floating-point operations of tiled attention for one query row over n keys (Exec::flops).
inline std::uint64_t tiled_attention_flops(int head_size, int n, int tile) {
    const std::uint64_t tiles = std::uint64_t(tile_count(n, tile));
    return std::uint64_t(n) * (2ull * head_size + 1)  // scores
           + 4ull * std::uint64_t(n)                  // max, subtract, exp, sum
           + 2ull * std::uint64_t(n) * head_size      // o_j
           + tiles * (6ull + 3ull * head_size)        // the folds
           + std::uint64_t(head_size);                // o / l
}

}  // namespace kvlab
