# expect: but the pool's slots are
# A crash-kind mistake: the slot one block too far (the table's entry plus one). Rows land in the
# next block, and the pool's last block points past the storage: the grader checks each slot
# before it uses one, so this is a FAIL naming the slot, not a write into memory that is not the
# pool's.
s|return std::int64_t(table\[std::size_t(t / block_size)\]) \* block_stride + t % block_size;|return std::int64_t(table[std::size_t(t / block_size)] + 1) * block_stride + t % block_size;|
