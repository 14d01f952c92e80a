"""A worker's prefix cache, as block hashes, and the key the gateway's prefix affinity routes a request by.

The cache keeps up to `num_blocks` full blocks, least recently used evicted first. A request that starts its
prefill on a worker holding its first k block hashes computes only the rest of its prompt; once its prefill is done
its blocks are cached. They are released tail first (the engine's prefix_cache.py releases a sequence's last block
first), so a prompt's head, which other requests share, outlives its tail, which is useless without the head.

The cache here is a budget of its own: in the engine, cached blocks are the KV pool's free blocks, evicted when a
running sequence needs one. A trace carries hashes, not tokens, so a block is cached or not as a whole.
"""
from __future__ import annotations

import math
from collections import OrderedDict

from inference.gateway.prefix_affinity import DEFAULT_NUM_CHARS

# The gateway keys affinity by the prompt's first DEFAULT_NUM_CHARS characters: at about four characters of English
# per token, these leading tokens.
KEY_TOKENS = DEFAULT_NUM_CHARS // 4


class PrefixCache:
    __slots__ = ("num_blocks", "blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.blocks: OrderedDict = OrderedDict()

    def match(self, hashes: tuple) -> int:
        """How many leading blocks of `hashes` are cached; those become the most recently used."""
        blocks, num = self.blocks, 0
        for block in hashes:
            if block not in blocks:
                break
            num += 1
        for block in reversed(hashes[:num]):
            blocks.move_to_end(block)
        return num

    def insert(self, hashes: tuple) -> None:
        """A prompt's blocks, once prefilled: tail first, so that the head is the most recently used."""
        if not self.num_blocks:
            return
        blocks = self.blocks
        for block in reversed(hashes):
            blocks[block] = None
            blocks.move_to_end(block)
        while len(blocks) > self.num_blocks:
            blocks.popitem(last=False)


def affinity_key(hashes: tuple, block_tokens: int, prompt_tokens: int) -> str | None:
    """The leading blocks the gateway's key covers; a prompt shorter than the key is its own key (its length stands
    for the text past its last full block). None without hashes: the request is routed by load alone."""
    if not hashes:
        return None
    num = math.ceil(KEY_TOKENS / block_tokens)
    if len(hashes) >= num:
        return repr(hashes[:num])
    return repr((hashes, prompt_tokens))
