// Lab 8: sharing. Fill in the five TODOs; `lessons/grade 8` grades this file.
//
// The pool (lab.h, given) hands out blocks of block_size positions; a sequence's block table
// maps its logical block b (positions b*block_size ..) to a physical block. What you keep right:
//   pool.refcount[block]  = how many block tables map the block
//   pool.free_list        = blocks nobody maps and no hash names (allocate() takes from the back)
// Given: pool.allocate(), pool.lookup(hash), pool.published(block), pool.copy_rows(to, from, n).
// The grader's cache (grade.cpp, SharedCache) calls your functions at these moments:
//   a new request        map_prefix(pool, seq, prompt), then it appends the rest of the prompt
//   before an append     before_append(pool, seq), then it allocates blocks for the new positions
//   a block fills        seq.hashes.push_back(block_hash(parent, its tokens, seq.model)), and
//                        the block is published under that hash (pool.publish)
//   fork / free          fork(pool, parent) / free_sequence(pool, seq)
#include "grader.h"
#include "lab.h"

namespace kvlab::lab08 {

// TODO 1 (the hash chain): mix parent, model and every token, in order, into 64 bits. Blocks
// with the same tokens after different prefixes, or of different models, must not collide.
std::uint64_t block_hash(std::uint64_t parent, std::span<const int> tokens, std::uint64_t model) {
    (void)parent, (void)tokens, (void)model;
    throw lessons::NotImplemented("block_hash");
}

// TODO 2 (a prefix hit): walk prompt block by block (whole blocks, at most prompt.size() - 1
// positions), chaining each block's hash on the previous one's; stop at the first hash the pool
// does not know. Each block found gets one owner more and goes into seq.table, its hash into
// seq.hashes. Return the positions mapped.
int map_prefix(Pool& pool, Sequence& seq, std::span<const int> prompt) {
    (void)pool, (void)seq, (void)prompt;
    throw lessons::NotImplemented("map_prefix");
}

// TODO 3 (fork): the child maps the parent's blocks; count the new owner of each.
Sequence fork(Pool& pool, const Sequence& parent) {
    (void)pool, (void)parent;
    throw lessons::NotImplemented("fork");
}

// TODO 4 (copy on write): the next row goes to position seq.tokens.size(). When it lands in a
// partially filled block that other tables map too, copy that block's rows into a fresh block
// and put the copy in seq.table instead.
void before_append(Pool& pool, Sequence& seq) {
    (void)pool, (void)seq;
    throw lessons::NotImplemented("before_append");
}

// TODO 5 (free): one owner fewer for each block; unmapped and unpublished blocks go back on the
// free list. Leave seq empty.
void free_sequence(Pool& pool, Sequence& seq) {
    (void)pool, (void)seq;
    throw lessons::NotImplemented("free_sequence");
}

}  // namespace kvlab::lab08
