# expect: ignores the model identity
# The block key is the parent and the tokens, as if the pool only ever served one model
# (proofs/planted.h: hash_ignores_model): another model's request with the same tokens maps rows it
# did not compute.
s|std::uint64_t LabManager::hash(const BlockKey& key) const { return key.hash(); }|std::uint64_t LabManager::hash(const BlockKey\& key) const { return BlockKey{key.parent, /* the mistake: */ 0, key.tokens}.hash(); }|
