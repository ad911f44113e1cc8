// Lab 7, reference solution. kvlab's BlockPool (core/paged.cpp) keeps the same free list beside
// reference counts and prefix hashes (lab 8); PagedCache::slot is the same translation.
#include <fmt/format.h>

#include "config.h"
#include "lab.h"

namespace kvlab::lab07 {

LabAllocator::LabAllocator(int n_blocks) : allocated_(std::size_t(n_blocks), 0) {
    // Taken from the back: block 0 first.
    for (int b = n_blocks - 1; b >= 0; b--) free_.push_back(b);
}

int LabAllocator::allocate() {
    if (free_.empty()) return -1;
    const int b = free_.back();
    free_.pop_back();
    allocated_[std::size_t(b)] = 1;
    return b;
}

void LabAllocator::free(int block) {
    if (block < 0 || block >= n_blocks() || !allocated_[std::size_t(block)])
        throw Error(fmt::format("block {} is not allocated", block));
    allocated_[std::size_t(block)] = 0;
    free_.push_back(block);
}

int LabAllocator::n_free() const { return int(free_.size()); }

std::int64_t translate(std::span<const int> table, int t, int block_size, std::int64_t block_stride) {
    return std::int64_t(table[std::size_t(t / block_size)]) * block_stride + t % block_size;
}

}  // namespace kvlab::lab07
