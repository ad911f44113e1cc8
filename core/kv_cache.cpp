#include "kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace kvlab {

namespace {
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
}

KVCache::KVCache(const Config& config) : config_(config) {
    config_.validate();
    const std::size_t n = std::size_t(config_.n_layers) * config_.max_seq * config_.kv_dim();
    // Unwritten memory is NaN, so a read past a sequence's length poisons the logits at once.
    k_.assign(n, kPoison);
    v_.assign(n, kPoison);
    layer_len_.assign(config_.n_layers, 0);
    assert(k_.size() == std::size_t(bytes_reserved() / 2 / sizeof(float)));
}

void KVCache::write(int l, int pos, const float* k_row, const float* v_row) {
    assert(l >= 0 && l < config_.n_layers);
    // Append-only: rewinding goes through truncate(), so a stale row is never silently reused.
    if (pos != layer_len_[l])
        throw Error(fmt::format("kv cache: layer {} expected position {}, got {}", l, layer_len_[l], pos));
    if (pos >= config_.max_seq)
        throw Error(fmt::format("kv cache: position {} is past max_seq {}", pos, config_.max_seq));
    const int hs = config_.head_size();
    for (int h = 0; h < config_.n_kv_heads; h++) {
        std::memcpy(k_.data() + offset(l, h, pos), k_row + h * hs, sizeof(float) * hs);
        std::memcpy(v_.data() + offset(l, h, pos), v_row + h * hs, sizeof(float) * hs);
    }
    layer_len_[l] = pos + 1;
    length_ = *std::min_element(layer_len_.begin(), layer_len_.end());
}

void KVCache::truncate(int n) {
    if (n < 0 || n > length_) throw Error(fmt::format("kv cache: cannot truncate to {} (length is {})", n, length_));
    const int hs = config_.head_size();
    for (int l = 0; l < config_.n_layers; l++) {
        for (int h = 0; h < config_.n_kv_heads; h++) {
            std::fill_n(k_.data() + offset(l, h, n), std::size_t(layer_len_[l] - n) * hs, kPoison);
            std::fill_n(v_.data() + offset(l, h, n), std::size_t(layer_len_[l] - n) * hs, kPoison);
        }
        layer_len_[l] = n;
    }
    length_ = n;
}

std::int64_t KVCache::bytes_for(const Config& c, int T, int bytes_per_scalar) {
    return 2ll * bytes_per_scalar * c.n_layers * std::int64_t(T) * c.n_kv_heads * c.head_size();
}
std::int64_t KVCache::bytes_used() const { return bytes_for(config_, length_); }
std::int64_t KVCache::bytes_reserved() const { return bytes_for(config_, config_.max_seq); }

}  // namespace kvlab
