"""block_manager.py's BlockManager with a planted bug for kvlab.verify to catch: a block's hash
covers its own tokens only, not the prefix before it. A prompt whose later block repeats another
request's block after different earlier tokens then maps rows computed after another prefix,
and a request starting with a block that stands later in another maps rows of other positions.
"""
from block_manager import BlockManager


class UnchainedBlockManager(BlockManager):
    def block_hash(self, prefix_hash, token_ids):
        return hash(tuple(token_ids))  # the planted bug: prefix_hash is left out
