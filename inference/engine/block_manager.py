"""Fixed-size KV blocks: which block holds which sequence's tokens. Never imports torch.

A block holds the K/V of `block_size` consecutive tokens of one sequence, for every layer; a sequence's block table
lists its blocks in token order, so token i lives in slot `block_table[i // block_size] * block_size + i % block_size`
of the model runner's cache.

Without prefix caching a block is either free or owned by exactly one sequence. With it (prefix_cache.py) a full
block whose K/V are computed is keyed by its prefix, may be shared by several sequences (a reference count), and is
kept after the last one releases it, evictable, until a block is needed and no never-used free block is left. At
admission a sequence starts from the longest cached prefix of full blocks (`num_cached_tokens` starts there).

"Used" means referenced by a sequence: an evictable cached block counts as free (`num_free_blocks`, `usage`,
`can_allocate`), because taking it costs nothing but a later cache miss.
"""
from __future__ import annotations

from collections import deque

from inference.engine.prefix_cache import PrefixCache
from inference.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Never used, or released without a key. Freed blocks go to the front, so that a busy engine keeps reusing
        # the same (cache-warm) blocks.
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.prefix_cache = PrefixCache(block_size) if enable_prefix_caching else None

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds: never used, plus cached ones that may be evicted."""
        num_evictable = len(self.prefix_cache.evictable) if self.prefix_cache else 0
        return len(self.free_block_ids) + num_evictable

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks keyed by their prefix, in use or evictable."""
        return self.prefix_cache.num_cached_blocks if self.prefix_cache else 0

    @property
    def usage(self) -> float:
        """Used / total blocks, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, seq: Sequence | None, num_tokens: int) -> list[int]:
        """The blocks of the longest cached prefix `seq` would start from if allocated now (none without a cache)."""
        if self.prefix_cache is None or seq is None or seq.block_table:
            return []
        return self.prefix_cache.match(seq, num_tokens)

    def num_cached_prefix_tokens(self, seq: Sequence) -> int:
        return len(self.cached_prefix(seq, seq.num_tokens)) * self.block_size

    def can_allocate(self, num_tokens: int, seq: Sequence | None = None) -> bool:
        """Whether `num_tokens` tokens (of `seq`, whose cached prefix then costs no block that others hold) fit."""
        hits = self.cached_prefix(seq, num_tokens)
        num_shared = sum(1 for block_id in hits if self.ref_counts[block_id] > 0)
        return self.num_blocks_for(num_tokens) - num_shared <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` (which owns no blocks) enough blocks for its first `num_tokens` tokens: its cached prefix, then
        new blocks; `num_cached_tokens` starts after the prefix."""
        assert not seq.block_table, f"{seq} already owns blocks"
        assert self.can_allocate(num_tokens, seq), "call can_allocate first"
        hits = self.cached_prefix(seq, num_tokens)
        for block_id in hits:
            if self.ref_counts[block_id] == 0:
                del self.prefix_cache.evictable[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table = hits + [self._take_free() for _ in range(self.num_blocks_for(num_tokens) - len(hits))]
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        if self.prefix_cache is not None:
            self.prefix_cache.num_queried_tokens += min(num_tokens, seq.num_tokens)
            self.prefix_cache.num_hit_tokens += seq.num_cached_tokens

    def can_append(self, seq: Sequence) -> bool:
        """Whether the next decode step of `seq` (which writes the K/V of its last token) has a slot."""
        return not self._needs_block(seq) or self.num_free_blocks >= 1

    def may_append(self, seq: Sequence) -> None:
        """Add a block to `seq` if its last token starts a new one."""
        if self._needs_block(seq):
            assert self.num_free_blocks >= 1, "call can_append first"
            seq.block_table.append(self._take_free())

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Key the blocks of `seq` that its computed tokens (`num_cached_tokens`) now fill (after each step), so that
        later requests, and this one after a preemption, find them."""
        if self.prefix_cache is None:
            return
        num_full = min(seq.num_cached_tokens // self.block_size, len(seq.block_table))
        if num_full <= seq.num_registered_blocks:
            return
        keys = self.prefix_cache.keys(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            self.prefix_cache.register(seq.block_table[i], keys[i])
        seq.num_registered_blocks = num_full

    def grow(self, seq: Sequence, num_tokens: int) -> int:
        """Give `seq` blocks for up to `num_tokens` tokens while free blocks last (speculative drafts: never at
        anyone's expense, cached blocks included: only never-used ones); return how many tokens its blocks now
        hold."""
        while len(seq.block_table) * self.block_size < num_tokens and self.free_block_ids:
            seq.block_table.append(self._take_free())
        return len(seq.block_table) * self.block_size

    def deallocate(self, seq: Sequence) -> None:
        # Last block first: a cached tail becomes evictable before its head (see prefix_cache.py).
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            assert self.ref_counts[block_id] >= 0, f"block {block_id} released twice"
            if self.ref_counts[block_id] > 0:
                continue
            if self.prefix_cache is not None and self.prefix_cache.is_cached(block_id):
                self.prefix_cache.evictable[block_id] = None
            else:
                self.free_block_ids.appendleft(block_id)
        seq.block_table = []
        seq.num_cached_tokens = 0
        seq.num_registered_blocks = 0

    def flush_prefix_cache(self) -> int:
        """Forget every cached block no sequence holds (a cold start, for measurements); returns how many."""
        if self.prefix_cache is None:
            return 0
        block_ids = self.prefix_cache.flush()
        self.free_block_ids.extend(block_ids)
        return len(block_ids)

    def _take_free(self) -> int:
        """A block for new tokens: a never-used free one, else the least recently released cached one."""
        block_id = self.free_block_ids.popleft() if self.free_block_ids else self.prefix_cache.evict_lru()
        self.ref_counts[block_id] = 1
        return block_id

    def _needs_block(self, seq: Sequence) -> bool:
        return len(seq.block_table) * self.block_size < seq.num_tokens
