# expect: a shared block
# The next row goes into the shared partial block (proofs/planted.h: cow_no_copy): a fork and its
# parent overwrite each other's next rows.
s|    if (pool.refcount\[std::size_t(last)\] == 1) return;|    return;  // the mistake: no copy, however many tables map the block|
