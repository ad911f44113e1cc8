# expect: refcount
# retain does not count the new owner a fork or a prefix hit adds: the first of the two to be
# freed hands back blocks the other still reads.
s|^    refcount_\[std::size_t(block)\]++;|    (void)block;  // the mistake: the new owner is not counted|
