// Lab 7: the block allocator and the address translation. Fill in the TODOs; `lessons/grade 7`
// grades this file.
#include "grader.h"
#include "lab.h"

namespace kvlab::lab07 {

// TODO 1: every block starts free (and not allocated).
LabAllocator::LabAllocator(int n_blocks) : allocated_(std::size_t(n_blocks), 0) {
    throw lessons::NotImplemented("LabAllocator::LabAllocator (fill the free list)");
}

// TODO 2: hand out a free block, or -1 when none is left.
int LabAllocator::allocate() { throw lessons::NotImplemented("LabAllocator::allocate"); }

// TODO 3: take an allocated block back; refuse (throw kvlab::Error) anything else.
void LabAllocator::free(int block) {
    (void)block;
    throw lessons::NotImplemented("LabAllocator::free");
}

// TODO 4
int LabAllocator::n_free() const { throw lessons::NotImplemented("LabAllocator::n_free"); }

// TODO 5: logical position -> physical slot, through the block table.
std::int64_t translate(std::span<const int> table, int t, int block_size, std::int64_t block_stride) {
    (void)table, (void)t, (void)block_size, (void)block_stride;
    throw lessons::NotImplemented("translate");
}

}  // namespace kvlab::lab07
