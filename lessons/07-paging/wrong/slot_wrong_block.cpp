// expect: differs
// A plausible mistake: the row inside a block computed with block_size - 1, so the last row of
// each block lands on the next block's first. (The allocator is right, written as a bitmap.)
#include <fmt/format.h>

#include <algorithm>

#include "config.h"
#include "lab.h"

namespace kvlab::lab07 {

LabAllocator::LabAllocator(int n_blocks) : allocated_(std::size_t(n_blocks), 0) {}

int LabAllocator::allocate() {
    for (std::size_t b = 0; b < allocated_.size(); b++)
        if (!allocated_[b]) return allocated_[b] = 1, int(b);
    return -1;
}

void LabAllocator::free(int block) {
    if (block < 0 || block >= n_blocks() || !allocated_[std::size_t(block)]) throw Error(fmt::format("bad free {}", block));
    allocated_[std::size_t(block)] = 0;
}

int LabAllocator::n_free() const { return int(std::count(allocated_.begin(), allocated_.end(), 0)); }

std::int64_t translate(std::span<const int> table, int t, int block_size, std::int64_t block_stride) {
    const int row = block_size > 1 ? t % (block_size - 1) : 0;
    return std::int64_t(table[std::size_t(t / block_size)]) * block_stride + row;
}

}  // namespace kvlab::lab07
