#include "window_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace kvlab {

WindowCache::WindowCache(const Config& config, int sinks, int window, int chunk, Memory& memory)
    : Cache(config), sinks_(sinks), window_(window), chunk_(chunk == 0 ? window : chunk) {
    if (sinks < 0) throw Error(fmt::format("window cache: sinks must be >= 0, not {}", sinks));
    if (window < 1) throw Error(fmt::format("window cache: window must be >= 1, not {}", window));
    if (chunk < 0) throw Error(fmt::format("window cache: chunk must be >= 0 (0 = window), not {}", chunk));
    // In int64: sinks + window + chunk may not fit an int, and then the ring is simply max_seq.
    const std::int64_t ring = std::int64_t(window_) + chunk_ - 1, full = sinks_ + ring;
    direct_ = full >= config_.max_seq;
    ring_ = int(std::min<std::int64_t>(ring, config_.max_seq));
    ring_size_ = int(std::min<std::int64_t>(full, config_.max_seq));
    const std::int64_t heads = std::int64_t(config_.n_layers) * config_.n_kv_heads;
    storage_ = KVStorage(memory, heads * ring_size_, config_.head_size(), std::int64_t(config_.n_kv_heads) * ring_size_,
                         ring_size_);
    owner_.assign(ring_size_, -1);
    assert(storage_.n_rows == heads * ring_size_ && owner_.size() == std::size_t(ring_size_));
}

void WindowCache::set_kv_format(KVFormat format, std::span<const float> scales) {
    if (length() != 0) throw Error(fmt::format("{}: the KV format changes only while the cache is empty", name()));
    storage_ = storage_.reformatted(config_.n_layers, format, scales);
}

int WindowCache::ring_slot(int pos) const {
    if (direct_ || pos < sinks_) return pos;
    return sinks_ + (pos - sinks_) % ring_;
}

bool WindowCache::resident(int t) const { return t >= 0 && t < length() && owner_[ring_slot(t)] == t; }

std::int64_t WindowCache::slot(int t) const { return resident(t) ? ring_slot(t) : -1; }

int WindowCache::attended(int pos, std::int64_t* slots, int* positions) const {
    int n = 0;
    auto take = [&](int t) {
        slots[n] = slot(t);
        if (positions) positions[n] = t;
        n++;
    };
    for (int t = 0; t < std::min(sinks_, pos + 1); t++) take(t);
    for (int t = std::max(sinks_, pos - window_ + 1); t <= pos; t++) take(t);
    return n;
}

void WindowCache::reserve(int new_length) {
    assert(new_length <= config_.max_seq && new_length - length() <= chunk_);
    for (int pos = length(); pos < new_length; pos++) {
        const int s = ring_slot(pos);
        if (owner_[s] >= 0) record(EventKind::evicted, owner_[s]);
        owner_[s] = pos;
        storage_.poison(config_, s, 1);  // the new position's rows read NaN until written, not the evicted ones
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
            storage_.poison(config_, s, 1);
        }
}

namespace {
// The ring slots a request writes, as they were: their owners and their rows.
struct WindowSnapshot final : CacheSnapshot {
    std::vector<int> slots, owner;  // [n] the slots, and the position each held (-1: none)
    Buffer<std::uint8_t> k, v;      // [n, n_layers, n_kv_heads, row_bytes] their rows
};
}  // namespace

// Writing a slot evicts the position it held, which a rollback cannot give back (a later
// rollback to just after that position would be refused): the slots the request writes are kept.
std::unique_ptr<CacheSnapshot> WindowCache::snapshot(int added) const {
    if (direct_) return Cache::snapshot(added);  // slot = position: nothing is ever overwritten
    auto s = std::make_unique<WindowSnapshot>();
    s->length = length();
    std::vector<bool> taken(std::size_t(ring_size_), false);  // [ring_size]
    for (int p = length(); p < length() + added && int(s->slots.size()) < ring_size_; p++)
        if (!taken[std::size_t(ring_slot(p))]) {
            taken[std::size_t(ring_slot(p))] = true;
            s->slots.push_back(ring_slot(p));
            s->owner.push_back(owner_[std::size_t(ring_slot(p))]);
        }
    const int heads = config_.n_layers * config_.n_kv_heads;
    const std::int64_t rb = storage_.row_bytes(), n = std::int64_t(s->slots.size()) * heads;
    s->k = Buffer<std::uint8_t>(storage_.memory(), n * rb), s->v = Buffer<std::uint8_t>(storage_.memory(), n * rb);
    assert(s->k.size() == n * rb && s->owner.size() == s->slots.size());
    for (std::size_t i = 0; i < s->slots.size(); i++)
        for (int lh = 0; lh < heads; lh++) {  // rows (l, h) of a slot: l * layer_rows + h * head_rows + slot
            const std::int64_t row = storage_.row(lh / config_.n_kv_heads, lh % config_.n_kv_heads, s->slots[i]);
            const std::int64_t at = (std::int64_t(i) * heads + lh) * rb;
            storage_.memory().copy(s->k.data() + at, storage_.k_row(row), rb);
            storage_.memory().copy(s->v.data() + at, storage_.v_row(row), rb);
        }
    return s;
}

void WindowCache::restore(const CacheSnapshot& snapshot) {
    const auto* copy = dynamic_cast<const WindowSnapshot*>(&snapshot);
    if (!copy) return Cache::restore(snapshot);
    const WindowSnapshot& s = *copy;
    const int heads = config_.n_layers * config_.n_kv_heads;
    const std::int64_t rb = storage_.row_bytes();
    for (std::size_t i = 0; i < s.slots.size(); i++) {
        owner_[std::size_t(s.slots[i])] = s.owner[i];
        for (int lh = 0; lh < heads; lh++) {
            const std::int64_t row = storage_.row(lh / config_.n_kv_heads, lh % config_.n_kv_heads, s.slots[i]);
            const std::int64_t at = (std::int64_t(i) * heads + lh) * rb;
            storage_.memory().copy(storage_.k_row(row), s.k.data() + at, rb);
            storage_.memory().copy(storage_.v_row(row), s.v.data() + at, rb);
        }
    }
    const int forgotten = length() - s.length;
    const std::vector<int> kept(tokens().begin(), tokens().begin() + s.length);
    set_tokens(kept);
    record(EventKind::rolled_back, s.length, forgotten);
}

MemoryStats WindowCache::memory() const {
    int resident_positions = 0;
    for (int t : owner_) resident_positions += t >= 0 && t < length();
    return position_rows_memory(config_, storage_, ring_size_, resident_positions);
}

std::string WindowCache::name() const { return fmt::format("window(sinks={},window={})", sinks_, window_); }

std::string FifoCache::name() const { return fmt::format("fifo(window={})", window()); }

}  // namespace kvlab
