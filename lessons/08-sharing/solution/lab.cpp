// Lab 8, reference solution. The hash is kvlab's own (BlockKey::hash, core/paged.cpp); the rest
// is what core's RefCountManager does, with a hash map of its own instead of full-key compares.
#include "lab.h"

namespace kvlab::lab08 {

LabManager::LabManager(int n_blocks)
    : refcount_(std::size_t(n_blocks), 0),
      published_(std::size_t(n_blocks), 0),
      hash_of_(std::size_t(n_blocks), 0),
      last_used_(std::size_t(n_blocks), 0) {
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);  // block 0 is handed out first
}

std::uint64_t LabManager::hash(const BlockKey& key) const { return key.hash(); }

int LabManager::lookup(const BlockKey& key) const {
    const auto it = by_hash_.find(hash(key));
    return it == by_hash_.end() ? -1 : it->second;
}

void LabManager::publish(int block, const BlockKey& key) {
    const std::uint64_t h = hash(key);
    if (published(block) || by_hash_.count(h)) return;  // another sequence computed the same block first
    by_hash_.emplace(h, block);
    hash_of_[std::size_t(block)] = h;
    published_[std::size_t(block)] = 1;
}

void LabManager::retain(int block) {
    refcount_[std::size_t(block)]++;
    last_used_[std::size_t(block)] = ++tick_;
}

bool LabManager::release(int block) {
    const std::size_t b = std::size_t(block);
    refcount_[b]--;
    last_used_[b] = ++tick_;
    if (refcount_[b] > 0 || published_[b]) return false;  // still mapped, or cached for later hits
    free_.push_back(block);
    return true;
}

int LabManager::available() const {
    int n = int(free_.size());
    for (int b = 0; b < n_blocks(); b++) n += refcount_[std::size_t(b)] == 0 && published_[std::size_t(b)];
    return n;
}

int LabManager::allocate(bool& evicted) {
    int block = -1;
    evicted = free_.empty();
    if (!evicted) {
        block = free_.back();
        free_.pop_back();
    } else {
        // The least recently used cached block.
        for (int b = 0; b < n_blocks(); b++)
            if (refcount_[std::size_t(b)] == 0 && published_[std::size_t(b)] &&
                (block < 0 || last_used_[std::size_t(b)] < last_used_[std::size_t(block)]))
                block = b;
        if (block < 0) throw Error("lab 8: no block to allocate (none free, none cached)");
        by_hash_.erase(hash_of_[std::size_t(block)]);  // a later lookup must not find its old rows
        published_[std::size_t(block)] = 0;
    }
    refcount_[std::size_t(block)] = 1;
    last_used_[std::size_t(block)] = ++tick_;
    return block;
}

bool LabManager::needs_copy(int block) const { return refcount(block) > 1 || published(block); }

}  // namespace kvlab::lab08
