# expect: the first block keeps its hash
# publish() files a block under its hash even when another block holds that hash already: the
# index moves to the newer block and the older one, still published, can no longer be found.
s|    if (published(block) \|\| by_hash_.count(h)) return;  // another sequence computed the same block first|    if (published(block)) return;|
s|    by_hash_.emplace(h, block);|    by_hash_[h] = block;  // the mistake: the first block loses its hash|
