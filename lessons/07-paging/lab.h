// Lab 7: paging. You write the block allocator and the block table's address translation; the
// grader builds a paged cache from them and runs kvlab's real decoders on it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvlab::lab07 {

// The pool's free list: blocks 0..n_blocks-1, each either free or allocated.
class LabAllocator {
public:
    explicit LabAllocator(int n_blocks);
    // A free block, now allocated; -1 when every block is allocated.
    int allocate();
    // Gives an allocated block back. Freeing a block that is not allocated (a double free, or
    // a block outside 0..n_blocks-1) throws kvlab::Error and changes nothing.
    void free(int block);
    // Blocks not allocated.
    int n_free() const;
    int n_blocks() const { return int(allocated_.size()); }

private:
    // Yours to use (you may add members): the free blocks, and which blocks are allocated.
    std::vector<int> free_;         // free blocks, in the order you hand them out
    std::vector<char> allocated_;   // [n_blocks] 1 when allocated
};

// The slot of logical position t of a sequence whose block table is `table`: position t lives
// in logical block t / block_size, at row t % block_size of that block; physical block b's
// first row is slot b * block_stride (a block spans block_stride rows of the storage, all its
// layers and KV heads).
std::int64_t translate(std::span<const int> table, int t, int block_size, std::int64_t block_stride);

}  // namespace kvlab::lab07
