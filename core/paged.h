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
//
// The pool is bookkeeping over a storage (as vLLM's block pool and nano-vllm's block manager):
// reference counts, a free list, hashes and LRU ticks are host-side integers; the rows live in
// one KVStorage, [n_blocks, n_layers, n_kv_heads, block_size, head_size], in any backend's
// memory. Position t of a sequence is slot table[t / block_size] * (n_layers * n_kv_heads *
// block_size) + t % block_size; the kernels read those slots, whatever the device.
//
// The pool is two parts: BlockPool holds the rows and does what a sequence asks; its BlockManager
// keeps the books (who maps what, the free blocks, the prefix cache) and makes every decision.
// A manager is a narrow interface of eleven calls, so another one (lab 8's) runs under the same
// caches and sequence engine.
//
// kvlab <-> vLLM: refcount = ref_cnt, published = has a block_hash (vLLM's "cached"), cached
// (unreferenced and published) = an eviction candidate in free_block_queue, BlockKey::hash =
// hash_block_tokens (parent hash, token ids, extra keys: here the model's identity),
// BlockManager = vLLM's BlockPool, BlockPool = the KV cache tensors plus what a request asks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "block_store.h"
#include "cache.h"

namespace kvlab {

// The identity of a full block's contents: what produced its rows.
struct BlockKey {
    std::uint64_t parent = 0;  // the previous block's hash (0 for the first block)
    std::uint64_t model = 0;   // the model's identity
    std::vector<int> tokens;   // [block_size]
    std::uint64_t hash() const;
    bool operator==(const BlockKey&) const = default;
};

// The bookkeeping of a pool's blocks 0..n_blocks-1 (vLLM's BlockPool, nano-vllm's BlockManager):
// how many block tables map each block, which are free, the prefix cache and what it evicts.
// BlockPool keeps the rows and asks its manager these questions and no others. Core's manager is
// RefCountManager (below); lab 8's students write their own, and kvlab's engine runs on it.
class BlockManager {
public:
    virtual ~BlockManager() = default;
    virtual int n_blocks() const = 0;
    // Blocks allocate() can hand out: free ones, and cached ones (published, mapped by nobody).
    virtual int available() const = 0;
    // A block mapped by one table: a free one, else a cached one evicted (`evicted` is then set,
    // and the block is no longer published). Callers check available() first.
    virtual int allocate(bool& evicted) = 0;
    virtual void retain(int block) = 0;  // one more table maps it (a prefix hit, a fork)
    // One table fewer maps it. Returns true when the block is free again: mapped by nobody and
    // not published (a published one stays cached, for later prefix hits, until evicted).
    virtual bool release(int block) = 0;
    virtual int refcount(int block) const = 0;  // how many tables map it
    virtual bool published(int block) const = 0;
    // The prefix cache. A full block's hash covers its whole key: the parent's hash, its tokens
    // and the model; so it names everything before it too.
    virtual std::uint64_t hash(const BlockKey& key) const = 0;
    virtual int lookup(const BlockKey& key) const = 0;         // the published block holding key, or -1
    virtual void publish(int block, const BlockKey& key) = 0;  // nothing if key is published already
    // Whether a write into `block` must go to a private copy first: another table maps it, or it
    // is published (a prefix hit may map it).
    virtual bool needs_copy(int block) const = 0;
};

// Core's manager: plain records, a free list, a hash index, and least recently used eviction.
class RefCountManager final : public BlockManager {
public:
    // One block's bookkeeping (vLLM's KVCacheBlock).
    struct Block {
        int ref_cnt = 0;
        bool published = false;       // in the prefix cache under `key` (vLLM: has a block_hash)
        BlockKey key;                 // set while published
        std::uint64_t last_used = 0;  // the tick of the last allocate, retain or release (LRU)
    };
    explicit RefCountManager(int n_blocks);

    int n_blocks() const override { return int(blocks_.size()); }
    int available() const override;
    int allocate(bool& evicted) override;
    void retain(int block) override;
    bool release(int block) override;
    int refcount(int block) const override { return at(block).ref_cnt; }
    bool published(int block) const override { return at(block).published; }
    std::uint64_t hash(const BlockKey& key) const override { return key.hash(); }
    int lookup(const BlockKey& key) const override;
    void publish(int block, const BlockKey& key) override;
    bool needs_copy(int block) const override { return refcount(block) > 1 || published(block); }
    const Block& at(int block) const { return blocks_[std::size_t(block)]; }

private:
    std::vector<Block> blocks_;                            // [n_blocks]
    std::vector<int> free_;                                // free blocks, taken from the back
    std::unordered_multimap<std::uint64_t, int> by_hash_;  // published blocks by key hash
    std::uint64_t tick_ = 0;
    void unpublish(int block);
};

// Blocks and their rows. The rows live in one KVStorage; which block is free, shared or cached
// is its manager's to say. The pool itself remembers only which sequence holds how many rows of
// each block, to poison (NaN) the rows nobody holds any more.
class BlockPool {
public:
    using BlockKey = kvlab::BlockKey;
    // Blocks of block_size positions for models of config's shape (n_layers, n_kv_heads,
    // head_size; max_seq bounds every sequence). prefix_caching publishes full blocks. Without a
    // manager, the pool keeps its books with a RefCountManager.
    BlockPool(const Config& config, int block_size, int n_blocks, bool prefix_caching = false,
              Memory& memory = host_memory(), std::unique_ptr<BlockManager> manager = nullptr);
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;
    // Sequences still alive are orphaned: each later use of one throws Error, destroying it is safe.
    virtual ~BlockPool() { *alive_ = false; }

    const Config& config() const { return config_; }
    int block_size() const { return block_size_; }
    int n_blocks() const { return n_blocks_; }
    bool prefix_caching() const { return prefix_caching_; }
    const BlockManager& manager() const { return *manager_; }

    int refcount(int b) const { return manager_->refcount(b); }
    bool published(int b) const { return manager_->published(b); }
    int n_free() const;    // mapped by nobody and not published
    int n_cached() const;  // mapped by nobody but published: reclaimable
    int n_used() const;    // in at least one block table
    int available() const { return manager_->available(); }
    // The most blocks held at once (by at least one sequence), and the most sequences holding
    // blocks at once, since the pool was made: how full a run drove it (verify's report).
    struct Peak {
        int blocks = 0, sequences = 0;
    };
    Peak peak() const { return peak_; }
    std::int64_t block_bytes() const { return kv_bytes(config_, block_size_, storage_.format); }
    // Writes that went into a block some other owner could read (shared, or published): the
    // invariant is that there are none.
    std::int64_t shared_writes() const { return shared_writes_; }
    // Prefill the prefix cache saved: positions served from cached blocks.
    std::int64_t prefix_hit_positions() const { return hit_positions_; }
    MemoryStats memory() const;

    const KVStorage& storage() const { return storage_; }
    KVFormat kv_format() const { return storage_.format; }
    // The format every block stores K and V in, and its scales (kv_format.h; empty: all 1);
    // changes only while no block is used. Cached blocks are evicted first: their rows are in
    // the old format, and a later prefix hit must not map them.
    virtual void set_kv_format(KVFormat format, std::span<const float> scales = {});
    // Where a block's rows start in storage: its row 0 of layer 0, KV head 0. The pool's own
    // copies, poisoning and host reads address blocks through this, never through slot().
    std::int64_t first_slot(int block) const {
        return std::int64_t(block) * config_.n_layers * config_.n_kv_heads * block_size_;
    }

    // ---- Three answers every PagedCache takes from its pool. They are virtual so that the
    // verification suite can plant a bug in one of them from outside (proofs/planted.h).
    // The slot of row s of a block (the storage row of layer 0, KV head 0).
    virtual std::int64_t slot(int block, int s) const { return first_slot(block) + s; }
    // Whether a write into `block` must go to a private copy first (the manager's answer).
    virtual bool needs_copy(int block) const { return manager_->needs_copy(block); }
    // The identity of a full block of `tokens` (block_size of them) after a block whose hash is
    // `parent` (0 for the first), computed by the model `model`.
    virtual BlockKey key(std::uint64_t parent, std::uint64_t model, std::span<const int> tokens) const;

    // Host-visible storage only (tests).
    const float* key_row(int block, int l, int h, int s) const;
    const float* value_row(int block, int l, int h, int s) const;

    std::vector<CacheEvent>* trace = nullptr;

    // ---- The tier below (block_store.h). With a store, a published block the pool evicts is put
    // there first, and a prefix lookup the pool misses asks the store (fetch).
    void set_store(BlockStore* store) { store_ = store; }  // not owned; null: none
    BlockStore* store() const { return store_; }
    // What this pool's records must name beside their key: its format (and scales) and shape.
    BlockShape block_shape() const;
    struct StoreStats {
        std::int64_t offloaded = 0;                    // records put: evicted blocks, and flushes
        std::int64_t fetched = 0;                      // blocks restored from records
        std::int64_t missed = 0;                       // lookups the store had no record for
        std::map<std::string, std::int64_t> rejected;  // records refused, by check_block_record's reason
        std::int64_t n_rejected() const;
    };
    const StoreStats& store_stats() const { return store_stats_; }
    // Puts every published block the store lacks (a process that ends leaves its prefixes behind);
    // returns how many.
    int flush_to_store();
    // A new block for `owner` holding the rows of the store's record for `key`, published; -1 when
    // the store has no record that checks out (a rejected one is erased), or no block is available.
    int fetch(const BlockKey& key, int owner, int seq);
    // Why a record is not the block `key` names, or empty (check_block_record). Virtual so that the
    // verification suite can plant a bug in it from outside (proofs/planted.h).
    virtual std::string check_record(std::span<const std::uint8_t> record, const BlockKey& key) const;

    // ---- What a sequence asks of its pool. A sequence is an owner number, never a pointer; `seq`
    // only names it in events. Callers check available() before allocating: check, then act.
    int join() { return next_owner_++; }  // a new owner number
    // false once the pool is destroyed: its sequences hold this to know they are orphaned.
    std::shared_ptr<const bool> alive() const { return alive_; }
    // A block for `owner`, holding 0 rows (the manager's choice; an evicted one is poisoned).
    // Throws Error when the manager hands out a block some sequence still holds.
    int allocate(int owner, int seq);
    // `owner` maps `block` too (a prefix hit, a fork), holding `rows` of its slots.
    void retain(int block, int owner, int seq, int rows);
    // `owner` now holds `rows` of block's slots (it appended, or rolled back); slots no holder
    // holds any more read NaN, unless the block is published (a full block, kept for hits).
    void hold(int block, int owner, int rows);
    // `owner` unmaps `block`. A block the manager frees reads NaN; with holders left, slots none
    // of them holds read NaN (a sharer that rolled back inside the block left them alone while
    // another could still read them).
    void release(int block, int owner, int seq);
    std::uint64_t hash(const BlockKey& key) const { return manager_->hash(key); }
    int lookup(const BlockKey& key) const { return manager_->lookup(key); }  // the published block, or -1
    void publish(int block, const BlockKey& key);
    void poison(int block, int from_slot);  // NaN in slots from_slot..block_size-1, every layer and head
    // The whole of block `from` (every layer and head) into block `to`: a copy-on-write, on the device.
    void copy_block(int to, int from);
    void event(EventKind kind, int seq, int block, int from = -1, int pos = -1, int count = 0) const;
    void count_shared_write() { shared_writes_++; }
    void count_prefix_hit(int positions) { hit_positions_ += positions; }

protected:
    // Evicts every cached block (published, mapped by nobody) from the prefix cache: free again.
    void drop_cached();
    // New storage for every block, all NaN, in the format (what set_kv_format does after drop_cached).
    void remake_storage(KVFormat format, std::span<const float> scales);

private:
    // One sequence's hold on a block: its owner number, and how many of the block's slots hold its rows.
    struct Holder {
        int owner = 0;
        int rows = 0;
    };
    Config config_;
    int block_size_, n_blocks_;
    bool prefix_caching_;
    std::unique_ptr<BlockManager> manager_;
    KVStorage storage_;                         // [n_blocks, n_layers, n_kv_heads, block_size] rows
    std::vector<std::vector<Holder>> holders_;  // [n_blocks] the sequences holding rows of each block
    int next_owner_ = 0;
    std::int64_t shared_writes_ = 0, hit_positions_ = 0;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    BlockStore* store_ = nullptr;
    StoreStats store_stats_;
    std::unordered_map<int, BlockKey> keys_;     // the key of each published block, to name its record
    int held_blocks_ = 0;                        // blocks with at least one holder
    std::unordered_map<int, int> owner_blocks_;  // owner -> blocks it holds, for owners holding any
    Peak peak_;
    void count_hold(bool block_was_free, int owner);  // a new holder: the counts and the peak
    void offload(int block);                          // block's record into the store, unless it has one
    Holder& holder(int block, int owner);
    int max_rows(int block) const;               // the most rows any holder holds (0 with none)
    void poison_unheld(int block, int old_max);  // NaN from max_rows() when it fell below old_max
};

// One sequence over a pool; its blocks go back when it is destroyed. A pool destroyed first
// orphans it: it keeps its tokens, and every use that needs the pool throws Error.
class PagedCache : public Cache {
public:
    // model_identity keys the prefix cache (Weights::fingerprint(): config and weights).
    PagedCache(BlockPool& pool, std::uint64_t model_identity = 0, int seq_id = 0);
    ~PagedCache() override;

    std::int64_t slot(int t) const override;
    int attended(int pos, std::int64_t* slots, int* positions = nullptr) const override;
    const KVStorage& storage() const override { return pool().storage(); }
    // The pool's format: BlockPool::set_kv_format.
    void set_kv_format(KVFormat format, std::span<const float> scales = {}) override;
    int attach_prefix(std::span<const int> tokens) override { return attach_prefix(tokens, 0); }
    // The same, fetching blocks the pool lacks from its store while it leaves more than
    // keep_available blocks available (a scheduler keeps its step's planned blocks).
    int attach_prefix(std::span<const int> tokens, int keep_available);
    // Publishes the blocks the request completed (prefix caching): a failed request publishes none.
    void committed() override;
    MemoryStats memory() const override;
    std::string name() const override;

    // A new sequence sharing every block of this one (copy-on-write on its first write). Rows of
    // this one's latest append that sit in a shared block can no longer be rewritten.
    std::unique_ptr<PagedCache> fork(int new_seq_id) const;
    const std::vector<int>& block_table() const { return table_; }
    // Blocks appending n positions takes from the pool now: new ones, and a private copy of a
    // shared or published block the next row would go into.
    int blocks_needed(int n) const;
    BlockPool& pool() const;  // throws Error once the pool is gone

protected:
    void reserve(int new_length) override;
    void on_write(int pos) override;
    void on_stored(int l, int pos) override;
    void release(int n) override;

private:
    BlockKey key_of(int b) const;          // the key of logical block b, from the tokens
    int rows_of(int b, int length) const;  // slots of logical block b a sequence of `length` holds
    BlockPool* pool_;
    std::shared_ptr<const bool> pool_alive_;  // false once the pool is destroyed: orphaned
    int owner_;                               // the pool's number for this sequence
    std::uint64_t model_;
    std::vector<int> table_;             // [ceil(length / block_size)] physical block of each logical block
    std::vector<std::uint64_t> hashes_;  // [length / block_size] hash of each full logical block
    // Blocks the running request completed, published when it commits: (logical block, key).
    std::vector<std::pair<int, BlockKey>> unpublished_;
};

// Throws Error, changing nothing, when appending added[s] positions to each paged sequence of a
// batch, in order, would run its pool dry (other variants are skipped); CachedDecoder::step calls
// it before appending any, since a copy-on-write cannot be rolled back. Each append takes what
// PagedCache::reserve takes: new blocks, and a copy of a shared partial block unless earlier
// sequences' copies have left it to this one alone. With several sequences, names the batch index.
void check_pool_room(std::span<Cache* const> caches, std::span<const int> added);

}  // namespace kvlab
