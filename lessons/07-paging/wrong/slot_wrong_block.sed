# expect: differs
# The row inside a block computed with block_size - 1: the last row of each block lands on the
# next block's first.
s|\* block_stride + t % block_size;|* block_stride + (block_size > 1 ? t % (block_size - 1) : 0);|
