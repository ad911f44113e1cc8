# expect: ignores the parent
# A block is keyed by its own tokens only: the same tokens after two different prefixes look like
# one block, though K and V depend on every earlier token.
s|std::uint64_t LabManager::hash(const BlockKey& key) const { return key.hash(); }|std::uint64_t LabManager::hash(const BlockKey\& key) const { return BlockKey{/* the mistake: */ 0, key.model, key.tokens}.hash(); }|
