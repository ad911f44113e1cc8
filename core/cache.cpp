#include "cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace kvlab {

namespace {
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
}

std::string_view to_string(EventKind kind) {
    switch (kind) {
        case EventKind::append: return "append";
        case EventKind::block_allocated: return "block_allocated";
        case EventKind::block_shared: return "block_shared";
        case EventKind::copy_on_write: return "copy_on_write";
        case EventKind::evicted: return "evicted";
        case EventKind::rolled_back: return "rolled_back";
        case EventKind::freed: return "freed";
        case EventKind::prefix_hit: return "prefix_hit";
        case EventKind::grown: return "grown";
    }
    return "?";
}

std::int64_t kv_bytes(const Config& c, std::int64_t T) {
    return 2ll * 4 * c.n_layers * T * c.n_kv_heads * c.head_size();
}

// ----------------------------------------------------------------------------------------------
// The interface's bookkeeping: token record, append window, bounds.

Cache::Cache(const Config& config) : config_(config) { config_.validate(); }

void Cache::append(std::span<const int> tokens) {
    const std::int64_t n = std::int64_t(tokens.size()), end = length() + n;
    if (n == 0) throw Error("kv cache: nothing to append");
    if (end > config_.max_seq)
        throw Error(fmt::format("kv cache: {} positions do not fit max_seq = {}", end, config_.max_seq));
    if (n > max_append())
        throw Error(
            fmt::format("kv cache: {} appends at most {} positions at a time, not {}", name(), max_append(), n));
    reserve(int(end));  // may throw: nothing has changed yet
    append_start_ = length();
    record(EventKind::append, length(), int(n));
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void Cache::write(int l, int pos, const float* k_row, const float* v_row) {
    if (l < 0 || l >= config_.n_layers) throw Error(fmt::format("kv cache: no layer {}", l));
    // Rows of earlier steps are final; rewriting one goes through truncate().
    if (pos < append_start_ || pos >= length())
        throw Error(fmt::format("kv cache: position {} is not one of the latest append's [{}, {})", pos, append_start_,
                                length()));
    store(l, pos, k_row, v_row);
}

int Cache::attended(int l, int h, int pos, const float** keys, const float** values) const {
    for (int t = 0; t <= pos; t++) {
        keys[t] = key(l, h, t);
        values[t] = value(l, h, t);
    }
    return pos + 1;
}

void Cache::truncate(int n) {
    if (n < 0 || n > length()) throw Error(fmt::format("kv cache: cannot roll back to {} (length is {})", n, length()));
    const int forgotten = length() - n;
    release(n);
    record(EventKind::rolled_back, n, forgotten);
    // The planted bug drops the rows above but keeps counting them.
    if (mutant != Mutant::rollback_keeps_length) tokens_.resize(n);
    append_start_ = std::min(append_start_, length());
}

int Cache::attach_prefix(std::span<const int>) { return 0; }

void Cache::adopt(std::span<const int> tokens) {
    assert(length() == 0);
    tokens_.assign(tokens.begin(), tokens.end());
    append_start_ = length();
}

void Cache::record(EventKind kind, int pos, int count, int block, int from) const {
    if (trace) trace->push_back(CacheEvent{kind, seq_id, pos, count, block, from});
}

// ----------------------------------------------------------------------------------------------
// Contiguous

ContiguousCache::ContiguousCache(const Config& config, Layout layout, int capacity)
    : Cache(config), layout_(layout), capacity_(capacity) {
    const std::size_t n = std::size_t(config_.n_layers) * capacity_ * config_.kv_dim();
    k_.assign(n, kPoison);
    v_.assign(n, kPoison);
    assert(k_.size() == n && v_.size() == n);
}

void ContiguousCache::reserve(int new_length) { assert(new_length <= capacity_); }

void ContiguousCache::store(int l, int pos, const float* k_row, const float* v_row) {
    const int hs = config_.head_size();
    for (int h = 0; h < config_.n_kv_heads; h++) {
        std::memcpy(k_.data() + offset(l, h, pos), k_row + h * hs, sizeof(float) * hs);
        std::memcpy(v_.data() + offset(l, h, pos), v_row + h * hs, sizeof(float) * hs);
    }
}

void ContiguousCache::release(int n) {
    const int hs = config_.head_size();
    for (int l = 0; l < config_.n_layers; l++)
        for (int h = 0; h < config_.n_kv_heads; h++)
            for (int t = n; t < length(); t++) {
                std::fill_n(k_.data() + offset(l, h, t), hs, kPoison);
                std::fill_n(v_.data() + offset(l, h, t), hs, kPoison);
            }
}

// Rows are a fixed stride apart: no per-row call (the same rows as the default, found faster).
int ContiguousCache::attended(int l, int h, int pos, const float** keys, const float** values) const {
    const std::int64_t base = offset(l, h, 0), stride = offset(l, h, 1) - base;
    for (int t = 0; t <= pos; t++) {
        keys[t] = k_.data() + base + t * stride;
        values[t] = v_.data() + base + t * stride;
    }
    return pos + 1;
}

MemoryStats ContiguousCache::memory() const {
    MemoryStats m;
    m.used_bytes = kv_bytes(config_, length());
    m.payload_bytes = m.reserved_bytes = kv_bytes(config_, capacity_);
    m.allocated_bytes = std::int64_t(sizeof(float) * (k_.size() + v_.size()));
    return m;
}

std::string ContiguousCache::name() const {
    return layout_ == Layout::head_major ? "contiguous-head" : "contiguous-seq";
}

// ----------------------------------------------------------------------------------------------
// Growing

GrowingCache::GrowingCache(const Config& config, int initial_capacity)
    : ContiguousCache(config, Layout::head_major, 0), initial_capacity_(initial_capacity) {
    if (initial_capacity < 1 || initial_capacity > config_.max_seq)
        throw Error(fmt::format("growing cache: initial capacity {} is outside [1, max_seq = {}]", initial_capacity,
                                config_.max_seq));
}

void GrowingCache::reserve(int new_length) {
    if (new_length <= capacity_) return;
    int cap = capacity_ == 0 ? initial_capacity_ : capacity_;
    while (cap < new_length) cap = int(std::min<std::int64_t>(2ll * cap, config_.max_seq));
    const int hs = config_.head_size();
    const std::size_t n = std::size_t(config_.n_layers) * config_.n_kv_heads * cap * hs;
    std::vector<float> k(n, kPoison), v(n, kPoison);  // [n_layers, n_kv_heads, cap, head_size]
    for (int l = 0; l < config_.n_layers; l++)
        for (int h = 0; h < config_.n_kv_heads; h++) {
            const std::size_t to = (std::size_t(l) * config_.n_kv_heads + h) * cap * hs;
            std::copy_n(k_.data() + offset(l, h, 0), std::size_t(length()) * hs, k.data() + to);
            std::copy_n(v_.data() + offset(l, h, 0), std::size_t(length()) * hs, v.data() + to);
        }
    if (capacity_ > 0) {
        reallocations_++;
        bytes_copied_ += kv_bytes(config_, length());
    }
    k_ = std::move(k);
    v_ = std::move(v);
    capacity_ = cap;
    assert(k_.size() == n && v_.size() == n);
    record(EventKind::grown, -1, cap);
}

MemoryStats GrowingCache::memory() const {
    MemoryStats m = ContiguousCache::memory();
    m.reallocations = reallocations_;
    m.bytes_copied = bytes_copied_;
    return m;
}

std::string GrowingCache::name() const { return fmt::format("growing(initial={})", initial_capacity_); }

}  // namespace kvlab
