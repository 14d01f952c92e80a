"""Fixed-size KV blocks: which block holds which sequence's tokens. Never imports torch.

A block holds the K/V of `block_size` consecutive tokens of one sequence, for every layer; a sequence's block table
lists its blocks in token order, so token i lives in slot `block_table[i // block_size] * block_size + i % block_size`
of the model runner's cache. Blocks are not shared (no prefix caching), so a block is either free or owned by exactly
one sequence.
"""
from __future__ import annotations

from collections import deque

from inference.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Used / total blocks, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.num_blocks_for(num_tokens) <= len(self.free_block_ids)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` (which owns no blocks) enough blocks for its first `num_tokens` tokens."""
        assert not seq.block_table, f"{seq} already owns blocks"
        num_needed = self.num_blocks_for(num_tokens)
        assert num_needed <= len(self.free_block_ids), "call can_allocate first"
        seq.block_table = [self.free_block_ids.popleft() for _ in range(num_needed)]

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next decode step of `seq` (which writes the K/V of its last token) has a slot."""
        return not self._needs_block(seq) or len(self.free_block_ids) >= 1

    def may_append(self, seq: Sequence) -> None:
        """Add a block to `seq` if its last token starts a new one."""
        if self._needs_block(seq):
            assert self.free_block_ids, "call can_append first"
            seq.block_table.append(self.free_block_ids.popleft())

    def grow(self, seq: Sequence, num_tokens: int) -> int:
        """Give `seq` blocks for up to `num_tokens` tokens while free blocks last (speculative drafts: never at
        anyone's expense); return how many tokens its blocks now hold."""
        while len(seq.block_table) * self.block_size < num_tokens and self.free_block_ids:
            seq.block_table.append(self.free_block_ids.popleft())
        return len(seq.block_table) * self.block_size

    def deallocate(self, seq: Sequence) -> None:
        # Freed blocks go to the front so that a busy engine keeps reusing the same (cache-warm) blocks.
        self.free_block_ids.extendleft(reversed(seq.block_table))
        seq.block_table = []
        seq.num_cached_tokens = 0

    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq.block_table) * self.block_size < seq.num_tokens
