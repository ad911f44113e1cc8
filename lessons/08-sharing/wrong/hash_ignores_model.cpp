// expect: ignores the model identity
// A plausible mistake: the block key is the parent and the tokens, as if the pool only ever
// served one model (core/mutants.h: hash_ignores_model). Another model's request with the same
// tokens maps rows it did not compute. The rest is the reference solution.
#include <cassert>

#include "lab.h"
#include "paged.h"

namespace kvlab::lab08 {

std::uint64_t block_hash(std::uint64_t parent, std::span<const int> tokens, std::uint64_t model) {
    (void)model;
    return BlockPool::BlockKey{parent, 0, {tokens.begin(), tokens.end()}}.hash();  // the mistake
}

int map_prefix(Pool& pool, Sequence& seq, std::span<const int> prompt) {
    assert(seq.table.empty() && seq.hashes.empty());
    const std::size_t bs = std::size_t(pool.block_size());
    // Whole blocks, and never the last token: it must run to give the request its logits.
    for (std::size_t b = 0; (b + 1) * bs < prompt.size(); b++) {
        const std::uint64_t h = block_hash(b ? seq.hashes.back() : 0, prompt.subspan(b * bs, bs), seq.model);
        const int block = pool.lookup(h);
        if (block < 0) break;  // a chain: once a block misses, no later one can be this prefix's
        pool.refcount[std::size_t(block)]++;
        seq.table.push_back(block);
        seq.hashes.push_back(h);
    }
    return int(seq.table.size() * bs);
}

Sequence fork(Pool& pool, const Sequence& parent) {
    for (int block : parent.table) pool.refcount[std::size_t(block)]++;
    return parent;
}

void before_append(Pool& pool, Sequence& seq) {
    const int bs = pool.block_size(), len = int(seq.tokens.size());
    // A full block is never written again (the next row opens a new block): only a partial last
    // block can be shared and written.
    if (len % bs == 0) return;
    int& last = seq.table.back();
    if (pool.refcount[std::size_t(last)] == 1) return;
    const int copy = pool.allocate();
    pool.copy_rows(copy, last, len % bs);
    pool.refcount[std::size_t(last)]--;  // still >= 1: the other owners keep it
    last = copy;
}

void free_sequence(Pool& pool, Sequence& seq) {
    for (int block : seq.table)
        if (--pool.refcount[std::size_t(block)] == 0 && !pool.published(block)) pool.free_list.push_back(block);
    seq.table.clear();
    seq.hashes.clear();
    seq.tokens.clear();
}

}  // namespace kvlab::lab08
