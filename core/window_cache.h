// kvlab core: StreamingLLM's window cache (attention sinks plus a sliding window).
//
// A query at pos attends to the first `sinks` positions (the sinks: softmax parks its excess mass
// on them, and dropping them is what breaks a plain sliding window) and to the last `window`
// positions up to pos. Everything in between is evicted, so memory stays bounded however long
// the sequence grows. Exact while pos + 1 <= sinks + window, approximate after.
//
// Rows live in a physical ring: slot t for a sink t < S, and slot S + (t - S) % R for t >= S,
// R = window + chunk - 1. A step writes at most chunk rows before reading them (max_append), so
// the newest write, at most p0 + chunk - 1, reuses the slot of p0 + chunk - 1 - R = p0 - window,
// just outside the window of the step's first query p0. When S + R >= max_seq the ring would be
// no smaller than the sequence, so slot = pos and nothing is ever evicted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache.h"

namespace kvlab {

class WindowCache : public Cache {
public:
    // chunk: the most positions one append may add; 0 means window. Throws Error for sinks < 0,
    // window < 1, chunk < 0.
    WindowCache(const Config& config, int sinks, int window, int chunk = 0, Memory& memory = host_memory());

    // The ring slot of t if t is resident (its slot still holds it), else -1.
    std::int64_t slot(int t) const override;
    // Sinks 0..min(S, pos + 1) - 1, then max(S, pos - W + 1)..pos, in increasing position.
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override;
    const KVStorage& storage() const override { return storage_; }
    // The ring is made again in the format, while the cache is empty.
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    int max_append() const override { return chunk_; }
    // The ring's rows and owners: a request in chunks overwrites evicted rows, which no
    // rollback can give back.
    std::unique_ptr<CacheSnapshot> snapshot(int added) const override;
    void restore(const CacheSnapshot& s) override;
    MemoryStats memory() const override;
    std::string name() const override;  // "window(sinks=S,window=W)"

    int sinks() const { return sinks_; }
    int window() const { return window_; }
    int chunk() const { return chunk_; }
    int ring_size() const { return ring_size_; }
    // The ring slot logical position pos goes to (resident or not).
    int ring_slot(int pos) const;
    // Whether position t < length() still has its rows in the ring.
    bool resident(int t) const;

protected:
    void reserve(int new_length) override;
    // Throws Error, changing nothing, when a position a query at n would attend was evicted.
    void release(int n) override;

private:
    int sinks_, window_, chunk_;
    int ring_;                    // R = window + chunk - 1: the ring slots after the sinks
    int ring_size_;               // min(sinks + R, max_seq) slots in all
    bool direct_;                 // sinks + R >= max_seq: slot = pos, nothing is ever evicted
    KVStorage storage_;           // k, v: [n_layers, n_kv_heads, ring_size, head_size], NaN where nothing is stored
    std::vector<int> owner_;      // [ring_size]: the position whose rows a slot holds, or -1
};

// FIFO: the last `window` positions and nothing else, the oldest dropped first; a window cache
// without sinks, named for what it is. Exact while T <= window.
class FifoCache : public WindowCache {
public:
    FifoCache(const Config& config, int window, int chunk = 0, Memory& memory = host_memory())
        : WindowCache(config, 0, window, chunk, memory) {}
    std::string name() const override;  // "fifo(window=W)"
};

}  // namespace kvlab
