# expect: which is not published
# An evicted block is marked unpublished but stays in the hash index: a later request with the old
# prefix maps the block, which now holds another sequence's rows.
s|^        by_hash_.erase(hash_of_\[std::size_t(block)\]);  // a later lookup must not find its old rows|        // the mistake: the hash still names the block|
