// expect: allocate() returned
// A plausible mistake: allocate reads the free list's last block but never removes it, so the
// next request gets the same block and two sequences overwrite each other's rows.
#include <fmt/format.h>

#include <algorithm>

#include "config.h"
#include "lab.h"

namespace kvlab::lab07 {

LabAllocator::LabAllocator(int n_blocks) : allocated_(std::size_t(n_blocks), 0) {
    for (int b = 0; b < n_blocks; b++) free_.push_back(b);
}

int LabAllocator::allocate() {
    if (free_.empty()) return -1;
    allocated_[std::size_t(free_.back())] = 1;
    return free_.back();  // still on the free list
}

void LabAllocator::free(int block) {
    if (block < 0 || block >= n_blocks() || !allocated_[std::size_t(block)]) throw Error(fmt::format("bad free {}", block));
    allocated_[std::size_t(block)] = 0;
    free_.push_back(block);
}

int LabAllocator::n_free() const { return int(std::count(allocated_.begin(), allocated_.end(), 0)); }

std::int64_t translate(std::span<const int> table, int t, int block_size, std::int64_t block_stride) {
    return table[std::size_t(t / block_size)] * block_stride + t % block_size;
}

}  // namespace kvlab::lab07
