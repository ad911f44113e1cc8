# expect: available() returned
# A published block nobody maps goes on the free list although it stays in the prefix cache: it is
# counted twice, and the next allocate() hands out rows a prefix hit may still map.
s|    if (refcount_\[b\] > 0 \|\| published_\[b\]) return false;  // still mapped, or cached for later hits|    if (refcount_[b] > 0) return false;  // the mistake: a published block is freed too|
