# expect: but the pool has
# A crash-kind mistake: lookup returns the block's number plus n_blocks, a block the pool does not
# have. The pool would map its rows from past the storage; the grader checks every block your
# manager returns before the pool uses it, so this is a FAIL naming the call and the block.
s|return it == by_hash_.end() ? -1 : it->second;|return it == by_hash_.end() ? -1 : it->second + n_blocks();|
