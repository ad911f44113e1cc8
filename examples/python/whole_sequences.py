"""block_manager.py's BlockManager with nano-vllm's limits, declared to kvlab.verify: sequences are
freed only whole (no release: a finished or preempted request gives back all its blocks), no fork,
block size 16 only, at most 32 sequences. kvlab then draws no rollback, speculative decoding or
fork, preempts and recomputes requests instead, and says in its report what it left out; no
rollback code is written for it.
"""
from block_manager import BlockManager


class WholeSequences(BlockManager):
    block_sizes = (16,)  # the block sizes a pool accepts
    max_sequences = 32  # the most sequences a pool holds at once
    release = None  # sequences are freed only whole, by destroy
    fork = None
