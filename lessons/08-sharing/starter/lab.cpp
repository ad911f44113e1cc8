// Lab 8: sharing. Fill in the five TODOs; `lessons/grade 8` grades this file.
//
// kvlab's block pool (core/paged.h, BlockPool) keeps the rows and asks your LabManager (lab.h)
// for every decision. When the engine (core/sequence_engine.h) does something, the pool calls:
//   a new request     lookup(key) block by block along the prompt (the key of block b chains on
//                     hash(key of block b - 1)), retain(block) for each block found, then
//                     allocate() for the blocks its other positions need
//   a block fills     hash(its key), and publish(block, key) when prefix caching is on
//   an append         needs_copy(block) for the partial block it writes into: if so,
//                     allocate() a copy, and release(block) the shared one
//   fork              retain(block) for each of the parent's blocks
//   rollback, free    release(block) for each block given up
//   before any of it  available(): a call that would need more blocks is refused first
#include "lab.h"

#include "grader.h"

namespace kvlab::lab08 {

// Given: every block starts free.
LabManager::LabManager(int n_blocks)
    : refcount_(std::size_t(n_blocks), 0),
      published_(std::size_t(n_blocks), 0),
      hash_of_(std::size_t(n_blocks), 0),
      last_used_(std::size_t(n_blocks), 0) {
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);  // block 0 is handed out first
}

// TODO 1 (the hash chain): mix key.parent, key.model and every token of key.tokens, in order,
// into 64 bits. Blocks with the same tokens after different prefixes, or of different models,
// must not collide.
std::uint64_t LabManager::hash(const BlockKey& key) const {
    (void)key;
    throw lessons::NotImplemented("LabManager::hash");
}

// TODO 2 (the prefix cache): by_hash_ and hash_of_; publishing a hash twice keeps the first.
int LabManager::lookup(const BlockKey& key) const {
    (void)key;
    throw lessons::NotImplemented("LabManager::lookup");
}

void LabManager::publish(int block, const BlockKey& key) {
    (void)block, (void)key;
    throw lessons::NotImplemented("LabManager::publish");
}

// TODO 3 (owners): refcount_, and a block nobody maps goes on the free list unless published.
// Both count as a use for eviction (last_used_).
void LabManager::retain(int block) {
    (void)block;
    throw lessons::NotImplemented("LabManager::retain");
}

bool LabManager::release(int block) {
    (void)block;
    throw lessons::NotImplemented("LabManager::release");
}

// TODO 4 (allocation): from the free list, else evict the least recently used cached block.
int LabManager::available() const { throw lessons::NotImplemented("LabManager::available"); }

int LabManager::allocate(bool& evicted) {
    (void)evicted;
    throw lessons::NotImplemented("LabManager::allocate");
}

// TODO 5 (copy on write): may another table read what is written into this block?
bool LabManager::needs_copy(int block) const {
    (void)block;
    throw lessons::NotImplemented("LabManager::needs_copy");
}

}  // namespace kvlab::lab08
