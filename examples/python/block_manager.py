"""A KV cache's bookkeeping in Python, in the style of nano-vllm's block manager, checked by kvlab.

Each sequence's positions live in blocks of block_size slots, listed in its block table. Blocks are
reference counted, so a fork and a request with a common prefix share them. After the forward pass
that fills a block (step_done), it is published under a hash of its tokens chained from the hash
of the block before it, so a later request whose prompt starts with the same tokens maps the block
instead of computing it again, and only rows already computed are ever shared.
A write into a block that is shared, or published, first copies it (copy-on-write): reserve
returns the copy for kvlab to make. Freed blocks keep their hash until they are taken again,
oldest freed first, so recent prefixes stay reusable.

    PYTHONPATH=build/python python3 examples/python/block_manager.py

runs kvlab.verify on it, on the copy with a planted bug in block_manager_unchained.py, and on
whole_sequences.py's manager, which frees sequences only whole.
"""
from collections import deque


class Block:
    def __init__(self, block_id):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = None  # set while published
        self.token_ids = []  # the tokens its rows were computed for, to confirm a hash match


class Sequence:
    def __init__(self):
        self.block_table = []  # the block of each logical block
        self.token_ids = []  # the tokens held
        self.full = 0  # logical blocks full at the last step_done (published)


class BlockManager:
    """A pool: cls(config) with config.n_slots slots in blocks of config.block_size."""

    def __init__(self, config):
        self.block_size = config.block_size
        self.blocks = [Block(i) for i in range(config.n_slots // config.block_size)]
        self.free_block_ids = deque(range(len(self.blocks)))  # oldest freed first
        self.hash_to_block_id = {}

    # ---- hashing and the free list

    def block_hash(self, prefix_hash, token_ids):
        return hash((prefix_hash, tuple(token_ids)))

    def _unpublish(self, block):
        if self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash = None

    def _let_go(self, block_id):
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_ids.append(block_id)

    def _publish(self, seq, b):
        block = self.blocks[seq.block_table[b]]
        prefix = self.blocks[seq.block_table[b - 1]].hash if b > 0 else None
        token_ids = seq.token_ids[b * self.block_size:(b + 1) * self.block_size]
        block.hash = self.block_hash(prefix, token_ids)
        block.token_ids = list(token_ids)
        self.hash_to_block_id[block.hash] = block.block_id

    # ---- the protocol kvlab.verify calls

    def create(self):
        return Sequence()

    def fork(self, seq):
        child = Sequence()
        child.block_table = list(seq.block_table)
        child.token_ids = list(seq.token_ids)
        child.full = seq.full
        for block_id in child.block_table:
            self.blocks[block_id].ref_count += 1
        return child

    def attach_prefix(self, seq, tokens):
        bs, prefix, hit = self.block_size, None, 0
        while hit + bs <= len(tokens) - 1:  # the last token always runs, for its logits
            h = self.block_hash(prefix, tokens[hit:hit + bs])
            block_id = self.hash_to_block_id.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens[hit:hit + bs]:
                break
            if self.blocks[block_id].ref_count == 0:
                self.free_block_ids.remove(block_id)
            self.blocks[block_id].ref_count += 1
            seq.block_table.append(block_id)
            prefix, hit = h, hit + bs
        seq.token_ids = list(tokens[:hit])
        seq.full = hit // bs
        return hit

    def _blocks_needed(self, seq, length, n):
        bs = self.block_size
        have, want = -(-length // bs), -(-(length + n) // bs)
        last = self.blocks[seq.block_table[-1]] if length % bs else None
        return want - have + (1 if last and (last.ref_count > 1 or last.hash is not None) else 0)

    def reserve(self, seq, length, tokens):
        bs, copies = self.block_size, []
        if self._blocks_needed(seq, length, len(tokens)) > len(self.free_block_ids):
            raise MemoryError(f"no room for {len(tokens)} positions after {length}")
        if length % bs:  # the last block is partly filled: the new rows go into it
            if self._needs_copy(self.blocks[seq.block_table[-1]]):
                old = seq.block_table[-1]
                new = self._take()
                copies.append((old * bs, new * bs, length % bs))
                self._let_go(old)
                seq.block_table[-1] = new
        for i, token in enumerate(tokens):
            pos = length + i
            if pos % bs == 0:
                seq.block_table.append(self._take())
            seq.token_ids.append(token)
        return copies

    def step_done(self, seq):
        """The forward pass wrote the latest rows: publish the blocks they filled."""
        for b in range(seq.full, len(seq.token_ids) // self.block_size):
            if self.blocks[seq.block_table[b]].hash is None:
                self._publish(seq, b)
        seq.full = len(seq.token_ids) // self.block_size

    def _needs_copy(self, block):
        return block.ref_count > 1 or block.hash is not None

    def _take(self):
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        if block.hash is not None:
            self._unpublish(block)  # taken for new rows: its old ones are about to be overwritten
        block.ref_count = 1
        return block_id

    def slot(self, seq, pos):
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def release(self, seq, n):
        keep = -(-n // self.block_size)
        for block_id in seq.block_table[keep:]:
            self._let_go(block_id)
        del seq.block_table[keep:]
        del seq.token_ids[n:]
        seq.full = min(seq.full, n // self.block_size)

    def destroy(self, seq):
        for block_id in reversed(seq.block_table):
            self._let_go(block_id)
        seq.block_table.clear()

    def memory(self):
        return 64 * len(self.blocks)  # a rough figure for reports


if __name__ == "__main__":
    import sys

    import kvlab
    from block_manager_unchained import UnchainedBlockManager
    from whole_sequences import WholeSequences

    good = kvlab.verify(BlockManager)
    print(good)
    bad = kvlab.verify(UnchainedBlockManager)
    print(bad)
    whole = kvlab.verify(WholeSequences)
    print(whole)
    sys.exit(0 if good and not bad and whole else 1)
