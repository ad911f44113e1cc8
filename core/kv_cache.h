// kvlab core: the contiguous KV cache.
//
// Like llama2.c's cache it is one preallocated array per tensor, reserved for max_seq
// positions; unlike llama2.c's [n_layers][max_seq][kv_dim] it is head-major, so the rows one
// attention head reads are adjacent in memory:
//   key[l][h][t][d]  at  ((l * n_kv_heads + h) * max_seq + t) * head_size + d
// A decode step writes row pos of every (layer, KV head), then attention reads rows 0..pos.
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"

namespace kvlab {

class KVCache {
public:
    explicit KVCache(const Config& config);

    // Stores the K and V rows of logical position pos for layer l: k_row, v_row are [kv_dim].
    // pos may be at most length(); writing at length() grows the cache by one.
    void write(int l, int pos, const float* k_row, const float* v_row);
    // The head_size floats of position t, for layer l and KV head h.
    const float* key(int l, int h, int t) const { return k_.data() + offset(l, h, t); }
    const float* value(int l, int h, int t) const { return v_.data() + offset(l, h, t); }

    int length() const { return length_; }
    int layer_length(int l) const { return layer_len_[l]; }
    // Forgets positions >= n (their memory is poisoned with NaN again).
    void truncate(int n);
    void clear() { truncate(0); }

    // 2 (K and V) * 4 bytes * n_layers * T * n_kv_heads * head_size, for T = length() and max_seq.
    std::int64_t bytes_used() const;
    std::int64_t bytes_reserved() const;
    static std::int64_t bytes_for(const Config& config, int T, int bytes_per_scalar = 4);

    const Config& config() const { return config_; }

private:
    std::int64_t offset(int l, int h, int t) const {
        return ((std::int64_t(l) * config_.n_kv_heads + h) * config_.max_seq + t) * config_.head_size();
    }
    Config config_;
    int length_ = 0;
    std::vector<float> k_;  // [n_layers, n_kv_heads, max_seq, head_size]
    std::vector<float> v_;  // [n_layers, n_kv_heads, max_seq, head_size]
    // Which layers have written position length_ (a position counts once every layer has it).
    std::vector<int> layer_len_;  // [n_layers]
};

}  // namespace kvlab
