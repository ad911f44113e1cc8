# expect: went into a block another sequence or a prefix hit could read
# A block only this sequence maps is written in place even when it is published: after a rollback
# into a full block, the next write changes rows a later prefix hit maps under the old key.
s|bool LabManager::needs_copy(int block) const { return refcount(block) > 1 \|\| published(block); }|bool LabManager::needs_copy(int block) const { return refcount(block) > 1; /* the mistake */ }|
