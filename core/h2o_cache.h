// kvlab core: H2O, the heavy-hitter oracle (Zhang et al., 2023): a cache of `recent + heavy`
// positions per layer and KV head, the latest `recent` and the `heavy` others with the largest
// accumulated attention.
//
// Every step's query hands the cache its softmax weights (Cache::attention_weights); a kept
// position's score is the sum of the weights it has received, over the steps since it arrived and
// over the query heads that read its KV head (in increasing head order, in fp32). When a new
// position arrives and every layer and head already holds the budget, each (layer, KV head) evicts
// one position older than the recent window: the one with the lowest score, the oldest on a tie.
// So what a layer and head keep differs from the others'; heavy = 0 is FIFO of `recent`.
//
// Rows live compacted, [n_layers, n_kv_heads, budget, head_size]: slot j of (l, h) holds its j-th
// kept position in increasing order, so every layer and head attends slots 0..held-1, in
// increasing logical position, through the one slot list a step shares. An eviction shifts the
// later rows of its (l, h) down by one. Steps add one position each: the next step's evictions
// depend on this step's weights.
//
// Exact while T <= recent + heavy (nothing is evicted); approximate beyond. A rollback of up to
// kRollbackSteps positions puts back exactly what those steps changed (their scores and evicted
// rows); further back is refused, as a window refuses what it evicted.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache.h"

namespace kvlab {

class H2OCache : public Cache {
public:
    static constexpr int kRollbackSteps = 8;

    // Throws Error for recent < 1 or heavy < 0.
    H2OCache(const Config& config, int recent, int heavy, Memory& memory = host_memory());

    // Layer 0, KV head 0's slot of t (head_slot gives every layer's and head's), or -1.
    std::int64_t slot(int t) const override;
    // Slots 0..held-1 (the same for every layer and head); positions: layer 0, KV head 0's.
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override;
    const KVStorage& storage() const override { return storage_; }
    // The rows are made again in the format, while the cache is empty.
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    int max_append() const override { return 1; }
    bool reads_attention() const override { return true; }
    // Adds w [n_heads, held] to the scores of the position appended last's step at layer l.
    void attention_weights(int l, std::span<const float> w) override;
    // A request longer than the rollback log keeps a copy of everything it can change.
    std::unique_ptr<CacheSnapshot> snapshot(int added) const override;
    void restore(const CacheSnapshot& s) override;
    MemoryStats memory() const override;
    std::string name() const override;  // "h2o(recent=R,heavy=H)"

    int recent() const { return recent_; }
    int heavy() const { return heavy_; }
    int capacity() const { return capacity_; }  // min(recent + heavy, max_seq) slots per layer and head
    int held() const { return held_; }
    // The positions layer l's KV head h keeps, in increasing order, and their scores.
    std::span<const int> kept(int l, int h) const;
    std::span<const float> scores(int l, int h) const;

protected:
    // The slot layer and KV head lh (l * n_kv_heads + h) evicts for a new position pos, the cache
    // being full: the lowest score among the positions older than the recent window, the oldest
    // on a tie. Lab 9's grader plugs a student's rule in here.
    virtual int victim(int lh, int pos) const;
    std::int64_t head_slot(int l, int h, int t) const override;
    void reserve(int new_length) override;
    // Undoes the steps after n from the log; throws Error, changing nothing, beyond it.
    void release(int n) override;

private:
    // What one step changed, to undo it: every (l, h)'s positions and scores before the step, and
    // the slot it evicted from (-1: none) with that slot's K and V rows.
    struct Step {
        std::vector<int> kept;           // [n_layers * n_kv_heads, capacity] as kept_ was
        std::vector<float> score;        // [n_layers * n_kv_heads, capacity] as score_ was
        std::vector<int> evicted;        // [n_layers * n_kv_heads] the slot evicted, or -1
        std::vector<std::uint8_t> k, v;  // [n_layers * n_kv_heads, row_bytes] the evicted rows
    };
    int pairs() const { return config_.n_layers * config_.n_kv_heads; }
    int* kept_of(int lh) { return kept_.data() + std::size_t(lh) * std::size_t(capacity_); }
    float* score_of(int lh) { return score_.data() + std::size_t(lh) * std::size_t(capacity_); }
    // Moves (l, h)'s rows of slots [from, to) by `by` slots (down: -1, up: +1).
    void shift_rows(int lh, int from, int to, int by);
    void undo(const Step& step);

    int recent_, heavy_, capacity_;
    bool direct_;               // recent + heavy >= max_seq: nothing is ever evicted
    KVStorage storage_;         // k, v: [n_layers, n_kv_heads, capacity, head_size], NaN where nothing is kept
    std::vector<int> kept_;     // [n_layers * n_kv_heads, capacity] position by slot, -1 past held
    std::vector<float> score_;  // [n_layers * n_kv_heads, capacity] accumulated weight by slot
    int held_ = 0;              // slots in use, in every (l, h)
    std::vector<Step> log_;     // the last kRollbackSteps steps, oldest first
};

}  // namespace kvlab
