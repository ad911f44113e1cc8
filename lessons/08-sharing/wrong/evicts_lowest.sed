# expect: the least recently used
# Eviction takes the lowest-numbered cached block, not the least recently used: a prefix used a
# moment ago is thrown out while a stale one stays.
s|(block < 0 \|\| last_used_\[std::size_t(b)\] < last_used_\[std::size_t(block)\]))|block < 0)  // the mistake: the first one found|
