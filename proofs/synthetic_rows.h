// kvlab proofs: K and V rows without a model, for the pool's state-machine tests and the
// course's sharing lab. A row is a hash of (model identity, every token up to its position,
// layer, K or V), so rows that a correct cache shares are equal, and a row read through a wrong
// block, another model's block or a stale prefix is not.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "cache.h"
#include "model.h"

namespace kvlab::proofs {

// Two model identities (Weights::fingerprint() in real use), named A and B in messages.
inline constexpr std::array<std::uint64_t, 2> kIdentity = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull};
inline constexpr char kIdentityName[2] = {'A', 'B'};

inline std::uint64_t mix(std::uint64_t h, std::uint64_t x) { return splitmix64_finalize(h ^ (x + 0x9e3779b97f4a7c15ull)); }

// The K (kv = 0) or V (kv = 1) row [kv_dim] model `ident` computes at position prefix.size() - 1
// of layer l: a function of every token up to there, as in a real model. V is offset so that it
// never equals K (a K/V swap is a failure too).
inline std::vector<float> synthetic_row(const Config& c, int ident, std::span<const int> prefix, int l, int kv) {
    std::uint64_t h = mix(kIdentity[std::size_t(ident)], prefix.size());
    for (int t : prefix) h = mix(h, std::uint64_t(t) + 1);
    h = mix(mix(h, std::uint64_t(l)), std::uint64_t(kv));
    std::vector<float> row(std::size_t(c.kv_dim()));  // [kv_dim]
    for (int i = 0; i < c.kv_dim(); i++)
        row[std::size_t(i)] = float(mix(h, std::uint64_t(i)) >> 40) / float(1 << 24) * 2 - 1 + (kv ? 8.0f : 0.0f);
    return row;
}

// append(tokens), then every layer's rows of the new positions, as a decoder's prefill does.
inline void append_rows(Cache& cache, int ident, std::span<const int> tokens) {
    const Config& c = cache.config();
    const int from = cache.length();
    cache.append(tokens);
    for (int l = 0; l < c.n_layers; l++)
        for (int pos = from; pos < cache.length(); pos++) {
            const auto prefix = cache.tokens().first(std::size_t(pos) + 1);
            const std::vector<float> k = synthetic_row(c, ident, prefix, l, 0), v = synthetic_row(c, ident, prefix, l, 1);
            cache.write(l, pos, k.data(), v.data());
        }
}

}  // namespace kvlab::proofs
