#include "window_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace kvlab {

namespace {
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
}

WindowCache::WindowCache(const Config& config, int sinks, int window, int chunk)
    : Cache(config), sinks_(sinks), window_(window), chunk_(chunk == 0 ? window : chunk) {
    if (sinks < 0) throw Error(fmt::format("window cache: sinks must be >= 0, not {}", sinks));
    if (window < 1) throw Error(fmt::format("window cache: window must be >= 1, not {}", window));
    if (chunk < 0) throw Error(fmt::format("window cache: chunk must be >= 0 (0 = window), not {}", chunk));
    // In int64: sinks + window + chunk may not fit an int, and then the ring is simply max_seq.
    const std::int64_t ring = std::int64_t(window_) + chunk_ - 1, full = sinks_ + ring;
    direct_ = full >= config_.max_seq;
    ring_ = int(std::min<std::int64_t>(ring, config_.max_seq));
    ring_size_ = int(std::min<std::int64_t>(full, config_.max_seq));
    const std::size_t n = std::size_t(config_.n_layers) * config_.n_kv_heads * ring_size_ * config_.head_size();
    k_.assign(n, kPoison);
    v_.assign(n, kPoison);
    owner_.assign(ring_size_, -1);
    nan_row_.assign(config_.head_size(), kPoison);
    assert(k_.size() == n && v_.size() == n && owner_.size() == std::size_t(ring_size_));
    assert(nan_row_.size() == std::size_t(config_.head_size()));
}

int WindowCache::slot(int pos) const {
    if (direct_ || pos < sinks_) return pos;
    return sinks_ + (pos - sinks_) % ring_;
}

bool WindowCache::resident(int t) const { return t >= 0 && t < length() && owner_[slot(t)] == t; }

const float* WindowCache::key(int l, int h, int t) const {
    return resident(t) ? k_.data() + offset(l, h, slot(t)) : nan_row_.data();
}

const float* WindowCache::value(int l, int h, int t) const {
    return resident(t) ? v_.data() + offset(l, h, slot(t)) : nan_row_.data();
}

int WindowCache::attended(int l, int h, int pos, const float** keys, const float** values) const {
    int n = 0;
    for (int t = 0; t < std::min(sinks_, pos + 1); t++, n++) {
        keys[n] = key(l, h, t);
        values[n] = value(l, h, t);
    }
    for (int t = std::max(sinks_, pos - window_ + 1); t <= pos; t++, n++) {
        keys[n] = key(l, h, t);
        values[n] = value(l, h, t);
    }
    return n;
}

void WindowCache::poison_slot(int s) {
    const int hs = config_.head_size();
    for (int l = 0; l < config_.n_layers; l++)
        for (int h = 0; h < config_.n_kv_heads; h++) {
            std::fill_n(k_.data() + offset(l, h, s), hs, kPoison);
            std::fill_n(v_.data() + offset(l, h, s), hs, kPoison);
        }
}

void WindowCache::reserve(int new_length) {
    assert(new_length <= config_.max_seq && new_length - length() <= chunk_);
    for (int pos = length(); pos < new_length; pos++) {
        const int s = slot(pos);
        if (owner_[s] >= 0) record(EventKind::evicted, owner_[s]);
        owner_[s] = pos;
        poison_slot(s);  // the new position's rows read NaN until written, not the evicted ones
    }
}

void WindowCache::store(int l, int pos, const float* k_row, const float* v_row) {
    const int hs = config_.head_size(), s = slot(pos);
    assert(owner_[s] == pos);
    for (int h = 0; h < config_.n_kv_heads; h++) {
        std::memcpy(k_.data() + offset(l, h, s), k_row + h * hs, sizeof(float) * hs);
        std::memcpy(v_.data() + offset(l, h, s), v_row + h * hs, sizeof(float) * hs);
    }
}

void WindowCache::release(int n) {
    // A query at n attends the sinks and max(S, n - W + 1)..n; n itself is written afresh, the
    // rest must still be here. Checked before anything changes (Cache::truncate relies on it).
    for (int t = std::max(sinks_, n - window_ + 1); t < n; t++)
        if (!resident(t))
            throw Error(fmt::format("window cache: cannot roll back to {}: position {} was already evicted", n, t));
    for (int s = 0; s < ring_size_; s++)
        if (owner_[s] >= n) {
            owner_[s] = -1;
            poison_slot(s);
        }
}

MemoryStats WindowCache::memory() const {
    int resident_positions = 0;
    for (int t : owner_) resident_positions += t >= 0 && t < length();
    MemoryStats m;
    m.used_bytes = kv_bytes(config_, resident_positions);
    m.payload_bytes = m.reserved_bytes = kv_bytes(config_, ring_size_);
    m.allocated_bytes = std::int64_t(sizeof(float) * (k_.size() + v_.size()));
    return m;
}

std::string WindowCache::name() const { return fmt::format("window(sinks={},window={})", sinks_, window_); }

}  // namespace kvlab
