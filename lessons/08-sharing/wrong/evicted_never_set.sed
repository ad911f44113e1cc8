# expect: evicted says whether
# allocate() takes the least recently used cached block when nothing is free, but never sets
# `evicted`: the pool is not told that a prefix block left the cache.
s|    evicted = free_.empty();|    evicted = false;  // the mistake\
    const bool from_cache = free_.empty();|
s|    if (!evicted) {|    if (!from_cache) {|
