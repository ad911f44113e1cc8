// Lab 8: sharing. Sequences share KV blocks two ways: a new request maps the full blocks of a
// cached prefix (found through a hash chained over the blocks), and a fork maps every block of
// its parent. You write the books of kvlab's block pool: how many block tables map each block,
// which blocks are free, the prefix cache, and which cached block to evict. kvlab's own pool
// (core/paged.h, BlockPool) keeps the rows and asks your manager every question; kvlab's sequence
// engine (requests, forks, rollbacks, frees, batched steps) and its real decoders run on it.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "paged.h"

namespace kvlab::lab08 {

// What you implement (starter/lab.cpp): core's BlockManager interface (core/paged.h). Blocks are
// numbered 0..n_blocks-1. Every block is in one of three states:
//   used    refcount > 0: some block table maps it
//   cached  refcount 0, published: its rows stay for later prefix hits until allocate evicts it
//   free    refcount 0, not published
class LabManager final : public BlockManager {
public:
    explicit LabManager(int n_blocks);

    int n_blocks() const override { return int(refcount_.size()); }
    int refcount(int block) const override { return refcount_.at(std::size_t(block)); }
    bool published(int block) const override { return published_.at(std::size_t(block)) != 0; }

    // ---- Yours.
    // 1. The hash chain. Mixes key.parent (the previous block's hash, 0 for block 0), every one of
    //    key.tokens in order, and key.model into 64 bits: equal keys hash equal; changing any
    //    part of the key gives another hash.
    std::uint64_t hash(const BlockKey& key) const override;
    // 2. The prefix cache. lookup: the published block whose key hashes as `key` does, or -1.
    //    publish: `block` (just filled) is published under key's hash, unless that hash is
    //    published already (another sequence computed the same block): then nothing changes.
    int lookup(const BlockKey& key) const override;
    void publish(int block, const BlockKey& key) override;
    // 3. Owners. retain: one more table maps `block` (a prefix hit, a fork). release: one table
    //    fewer; returns true when the block is now free (nobody maps it and it is not published;
    //    a published one stays cached instead).
    void retain(int block) override;
    bool release(int block) override;
    // 4. Allocation. available: the blocks allocate() can hand out, free or cached. allocate: a
    //    block with refcount 1; a free one if there is any, else the cached block least recently
    //    allocated, retained or released is evicted: unpublished (a lookup no longer finds it),
    //    and `evicted` set. Throws kvlab::Error when there is neither.
    int available() const override;
    int allocate(bool& evicted) override;
    // 5. Copy on write. Whether a write into `block` must go to a private copy first: another
    //    table maps it too, or it is published (a prefix hit may map it at any time).
    bool needs_copy(int block) const override;

private:
    // Yours to use (you may add members).
    std::vector<int> refcount_;                       // [n_blocks] how many block tables map each block
    std::vector<char> published_;                     // [n_blocks] 1 while in the prefix cache
    std::vector<std::uint64_t> hash_of_;              // [n_blocks] a published block's hash
    std::unordered_map<std::uint64_t, int> by_hash_;  // hash -> published block
    std::vector<int> free_;                           // free blocks; allocate() takes from the back
    std::vector<std::uint64_t> last_used_;            // [n_blocks] tick_ at the last allocate, retain or release
    std::uint64_t tick_ = 0;
};

}  // namespace kvlab::lab08
