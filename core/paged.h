// kvlab core: the paged cache (vLLM's PagedAttention layout), prefix caching, fork and
// copy-on-write.
//
// A BlockPool owns n_blocks fixed-size blocks of block_size positions each; a PagedCache is one
// sequence: a block table mapping logical block pos / block_size to a physical block, the row
// at slot pos % block_size. Blocks are taken from a free list when a sequence needs one, so a
// request holds ceil(T / block_size) blocks instead of a max_seq reservation.
//
// Sharing: a block may sit in several tables (reference counted). Two ways create sharing:
//  - prefix caching: a full block is published under a hash chained over (the parent block's
//    hash, the block's token ids, the model's identity); a new request maps the blocks of its
//    longest cached prefix instead of recomputing them. Unreferenced published blocks stay
//    resident and are evicted least recently used when the free list runs dry.
//  - fork: a child sequence maps all of its parent's blocks (parallel samples, beams). Whoever
//    writes into a shared partially filled block first gets a private copy (copy-on-write).
// Full blocks are never written again, so sharing them is free.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache.h"

namespace kvlab {

class PagedCache;

class BlockPool {
public:
    // Blocks of block_size positions for models of config's shape (n_layers, n_kv_heads,
    // head_size; max_seq bounds every sequence). prefix_caching publishes full blocks.
    BlockPool(const Config& config, int block_size, int n_blocks, bool prefix_caching = false);
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    const Config& config() const { return config_; }
    int block_size() const { return block_size_; }
    int n_blocks() const { return n_blocks_; }
    bool prefix_caching() const { return prefix_caching_; }

    int refcount(int block) const { return refcount_[block]; }
    bool published(int block) const { return published_[block] != 0; }
    int n_free() const { return int(free_.size()); }  // on the free list
    int n_cached() const;                             // unreferenced but published: reclaimable
    int n_used() const;                               // in at least one block table
    int available() const { return n_free() + n_cached(); }
    std::int64_t block_bytes() const { return kv_bytes(config_, block_size_); }
    // Writes that went into a block some other owner could read (shared, or published): the
    // invariant is that there are none.
    std::int64_t shared_writes() const { return shared_writes_; }
    // Prefill the prefix cache saved: positions served from cached blocks.
    std::int64_t prefix_hit_positions() const { return hit_positions_; }
    MemoryStats memory() const;

    float* key_row(int block, int l, int h, int slot) { return k_.data() + offset(block, l, h, slot); }
    float* value_row(int block, int l, int h, int slot) { return v_.data() + offset(block, l, h, slot); }
    const float* key_row(int block, int l, int h, int slot) const { return k_.data() + offset(block, l, h, slot); }
    const float* value_row(int block, int l, int h, int slot) const { return v_.data() + offset(block, l, h, slot); }

    std::vector<CacheEvent>* trace = nullptr;
    Mutant mutant = Mutant::none;

private:
    friend class PagedCache;
    // The identity of a full block's contents.
    struct BlockKey {
        std::uint64_t parent = 0;  // the previous block's hash (0 for the first block)
        std::uint64_t model = 0;   // the model's identity
        std::vector<int> tokens;   // [block_size]
        std::uint64_t hash() const;
        bool operator==(const BlockKey&) const = default;
    };
    std::int64_t offset(int block, int l, int h, int slot) const {
        const Config& c = config_;
        return (((std::int64_t(block) * c.n_layers + l) * c.n_kv_heads + h) * block_size_ + slot) * c.head_size();
    }
    // A block for seq with refcount 1: from the free list, else the least recently used cached
    // one (unpublished first). Callers check available() beforehand.
    int allocate(const PagedCache* owner);
    void retain(int block, const PagedCache* owner);
    // At refcount 0 the block stays cached if published, else is freed. At refcount 1 the last
    // owner's rows past its length are poisoned: a sharer that rolled back inside the block left
    // them alone while someone else could still read them.
    void release(int block, const PagedCache* owner);
    int lookup(const BlockKey& key);  // the published block holding key, or -1
    void publish(int block, BlockKey key);
    void unpublish(int block);
    void poison(int block, int from_slot);  // NaN in slots from_slot..block_size-1, every layer and head
    void event(EventKind kind, int seq, int block, int from = -1, int pos = -1, int count = 0) const;

    Config config_;
    int block_size_, n_blocks_;
    bool prefix_caching_;
    std::vector<float> k_;                                // [n_blocks, n_layers, n_kv_heads, block_size, head_size]
    std::vector<float> v_;                                // [n_blocks, n_layers, n_kv_heads, block_size, head_size]
    std::vector<int> refcount_;                           // [n_blocks]
    std::vector<int> free_;                               // free blocks, taken from the back
    std::vector<char> published_;                         // [n_blocks]
    std::vector<BlockKey> keys_;                          // [n_blocks] a published block's key
    std::vector<std::uint64_t> last_used_;                // [n_blocks] tick of the last retain or release
    std::vector<std::vector<const PagedCache*>> owners_;  // [n_blocks] the sequences mapping each block
    std::unordered_multimap<std::uint64_t, int> by_hash_;
    std::uint64_t tick_ = 0;
    std::int64_t shared_writes_ = 0, hit_positions_ = 0;
};

// One sequence over a pool. The pool must outlive it; its blocks go back when it is destroyed.
class PagedCache : public Cache {
public:
    // model_identity keys the prefix cache (Weights::fingerprint(): config and weights).
    PagedCache(BlockPool& pool, std::uint64_t model_identity = 0, int seq_id = 0);
    ~PagedCache() override;

    const float* key(int l, int h, int t) const override;
    const float* value(int l, int h, int t) const override;
    int attended(int l, int h, int pos, const float** keys, const float** values) const override;
    int attach_prefix(std::span<const int> tokens) override;
    MemoryStats memory() const override;
    std::string name() const override;

    // A new sequence sharing every block of this one (copy-on-write on its first write).
    std::unique_ptr<PagedCache> fork(int new_seq_id) const;
    const std::vector<int>& block_table() const { return table_; }
    BlockPool& pool() const { return pool_; }

protected:
    void reserve(int new_length) override;
    void store(int l, int pos, const float* k_row, const float* v_row) override;
    void release(int n) override;

private:
    int slot(int pos) const;
    BlockPool::BlockKey key_of(int b) const;  // the key of logical block b, from the tokens
    BlockPool& pool_;
    std::uint64_t model_;
    std::vector<int> table_;             // [ceil(length / block_size)] physical block of each logical block
    std::vector<std::uint64_t> hashes_;  // [length / block_size] hash of each full logical block
    std::vector<float> nan_row_;         // [head_size] NaN: what a position with no block reads
};

}  // namespace kvlab
