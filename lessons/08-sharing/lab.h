// Lab 8: sharing. Sequences share KV blocks two ways: a new request maps the full blocks of a
// cached prefix (found through a hash chained over the blocks), and a fork maps every block of
// its parent. A block's reference count says how many block tables map it; the first write into
// a shared, partially filled block goes into a private copy. You write those steps over the
// pool's bookkeeping below. The grader's paged cache (grade.cpp, SharedCache) calls them, and
// kvlab's real decoders run on it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache.h"

namespace kvlab::lab08 {

// The block pool (given; its functions are in grade.cpp). Host integers say who holds what; the
// rows live in storage(), laid out as kvlab's BlockPool (core/paged.h):
//   k, v: [n_blocks, n_layers, n_kv_heads, block_size] rows of head_size floats
class Pool {
public:
    Pool(const Config& config, int block_size, int n_blocks);

    const Config& config() const { return config_; }
    int block_size() const { return block_size_; }
    int n_blocks() const { return int(refcount.size()); }

    // ---- The bookkeeping your functions keep right.
    std::vector<int> refcount;   // [n_blocks] how many block tables map each block
    std::vector<int> free_list;  // blocks nobody maps and no hash names; allocate() takes from the back

    // ---- Given.
    // A block for one new owner: refcount 1, every row NaN. From the free list, else a published
    // block nobody maps is evicted (unpublished). Throws Error when there is neither.
    int allocate();
    int available() const;  // blocks allocate() can hand out: free, or published and unmapped
    // The prefix cache: published full blocks by key hash. lookup gives -1 for an unknown hash.
    int lookup(std::uint64_t hash) const;
    bool published(int block) const { return published_[std::size_t(block)] != 0; }
    void publish(int block, std::uint64_t hash);  // the grader's cache, when a block fills
    // Rows of slots 0..n-1 of block `from` into block `to`, every layer and KV head.
    void copy_rows(int to, int from, int n);
    // The storage slot of row s of a block (the row of layer 0, KV head 0).
    std::int64_t slot(int block, int s) const {
        return std::int64_t(block) * config_.n_layers * config_.n_kv_heads * block_size_ + s;
    }
    const KVStorage& storage() const { return storage_; }

private:
    Config config_;
    int block_size_;
    KVStorage storage_;
    std::vector<char> published_;                     // [n_blocks]
    std::vector<std::uint64_t> hash_of_;              // [n_blocks] a published block's hash
    std::unordered_map<std::uint64_t, int> by_hash_;  // hash -> published block
};

// One sequence's blocks (the grader's cache keeps `tokens` up to date).
struct Sequence {
    std::uint64_t model = 0;            // the identity of the model whose rows it holds
    std::vector<int> tokens;            // [length]
    std::vector<int> table;             // [ceil(length / block_size)] logical block -> physical block
    std::vector<std::uint64_t> hashes;  // [length / block_size] the key hash of each full block
};

// ---- What you implement (starter/lab.cpp).

// 1. The hash chain. The key hash of a full block: its parent's hash (the previous block's; 0
//    for block 0), its block_size tokens, and the model identity. Equal keys give equal hashes;
//    changing any part of the key gives another.
std::uint64_t block_hash(std::uint64_t parent, std::span<const int> tokens, std::uint64_t model);

// 2. A prefix hit. seq is new and empty. Map the longest prefix of `prompt` the pool has
//    published, in whole blocks and at most prompt.size() - 1 positions (the last token always
//    runs, for its logits): append the blocks to seq.table and their hashes to seq.hashes; each
//    has one owner more. Returns how many positions it mapped.
int map_prefix(Pool& pool, Sequence& seq, std::span<const int> prompt);

// 3. Fork. A new sequence mapping every block of parent (its tokens, table and hashes, for the
//    same model); each block has one owner more.
Sequence fork(Pool& pool, const Sequence& parent);

// 4. Copy on write. Called before seq's next row is written, at position seq.tokens.size(). If
//    that row goes into a partially filled block that another table maps too, seq gets a private
//    copy of it first (pool.allocate, pool.copy_rows of the rows seq holds there), and the shared
//    block has one owner fewer.
void before_append(Pool& pool, Sequence& seq);

// 5. Free. seq is done: each of its blocks has one owner fewer. A block nobody maps any more
//    goes back on the free list, unless it is published: then it stays cached for later prefix
//    hits until allocate() evicts it. seq is left empty.
void free_sequence(Pool& pool, Sequence& seq);

}  // namespace kvlab::lab08
