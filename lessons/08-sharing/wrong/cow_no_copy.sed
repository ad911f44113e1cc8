# expect: went into a block another sequence or a prefix hit could read
# No copy, however many tables map the block (proofs/planted.h: cow_no_copy): a fork and its
# parent overwrite each other's next rows.
s|bool LabManager::needs_copy(int block) const { return refcount(block) > 1 \|\| published(block); }|bool LabManager::needs_copy(int) const { return false; /* the mistake */ }|
