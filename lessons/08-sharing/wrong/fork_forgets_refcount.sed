# expect: block tables map it
# fork copies the block table but does not count the child as an owner: the first of the two to
# be freed hands back blocks the other still reads.
s|    for (int block : parent.table) pool.refcount\[std::size_t(block)\]++;|    (void)pool;  // the mistake: the child is not counted|
