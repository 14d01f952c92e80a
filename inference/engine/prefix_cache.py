"""Content-addressed KV blocks: which full blocks hold which token prefix, and which of them may be evicted. Never
imports torch.

A full block's key is a digest of its tokens chained with its parent block's key (blake2b, 16 bytes), so two
sequences share a block only when every token before and in it is the same: a key names a whole prefix. A
cryptographic digest, not Python's `hash`: a client who could craft a colliding prompt would read another request's
K/V. Only full blocks whose K/V are computed are ever keyed (the block manager registers them after each step), so a
cached block never changes again.

A sequence with a cache salt (its tenant's, docs/tenants.md) keys its blocks with it (blake2b's key), so that it
shares blocks only with sequences of the same salt: a crafted prompt cannot tell by its time to first token whether
another tenant sent that prompt. The exception is the deployment's shared prompt (`num_shared_tokens`): the blocks
that hold nothing but its leading tokens are keyed without salt, so every tenant reuses them. They hold only what
the deployment shares with all, so a hit on them tells nobody anything private.

The cache keeps a block after the last sequence that used it lets go (reference count 0): such a block is free to
reuse but still holds its K/V, and sits in `evictable`, least recently released first. A sequence that releases its
blocks releases its last block first, so a prompt's tail is evicted before its head (a head block is what other
requests share, and a tail block is useless without its head). The block manager evicts only when no never-used
free block is left.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from inference.engine.sequence import Sequence

_ROOT = b""  # the parent key of a sequence's first block


def block_key(parent: bytes, token_ids: list[int], salt: bytes = b"") -> bytes:
    """`salt` (at most 64 bytes) keys the digest; empty: unsalted."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16, key=salt).digest()


def shared_prompt_ids(tokenizer, text: str | None) -> list[list[int]]:
    """The shared prompt's tokenizations as a request may begin with it: a prompt that starts with it, and a chat whose
    system message it is (as the worker tokenizes each: inference/worker/model_engine.py)."""
    if text is None:
        return []
    forms = [tokenizer.encode(text)]
    if getattr(tokenizer, "chat_template", None):
        try:
            chat = tokenizer.apply_chat_template([{"role": "system", "content": text}], add_generation_prompt=False,
                                                 tokenize=False)
            forms.append(tokenizer.encode(chat, add_special_tokens=False))
        except Exception:  # a template that refuses a system message alone: chats then share nothing
            pass
    return forms


def num_shared_tokens(token_ids: list[int], shared_prefixes: list[list[int]]) -> int:
    """How many leading tokens of a prompt are the shared prompt's: its longest common prefix with any of its
    tokenizations (as a prompt's start, as a chat's system message). Token-wise, so that text merged into the shared
    prompt's last token is never counted as shared."""
    best = 0
    for shared in shared_prefixes:
        n = 0
        for a, b in zip(token_ids, shared):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best


class PrefixCache:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.block_of: dict[bytes, int] = {}  # key -> block id, for every cached block (in use or evictable)
        self.key_of: dict[int, bytes] = {}    # block id -> key, the same blocks
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks no sequence holds, LRU first
        # At admission: tokens looked up, and tokens found cached (prefill they skip).
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_cached_blocks(self) -> int:
        return len(self.key_of)

    def keys(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The keys of the first `num_blocks` blocks of `seq` (all full), memoised on the sequence: its tokens only
        ever grow, so a full block's key never changes. Salted, but for the blocks within its shared prompt."""
        bs, keys = self.block_size, seq.block_hashes
        while len(keys) < num_blocks:
            i = len(keys)
            salt = b"" if (i + 1) * bs <= seq.num_shared_tokens else seq.cache_salt
            keys.append(block_key(keys[-1] if keys else _ROOT, seq.token_ids[i * bs:(i + 1) * bs], salt))
        return keys[:num_blocks]

    def match(self, seq: Sequence, num_tokens: int) -> list[int]:
        """The block ids of the longest cached prefix of full blocks among the first `num_tokens` tokens, leaving at
        least the last token to compute (a step must feed a token to sample the next one)."""
        num_blocks = (min(num_tokens, seq.num_tokens) - 1) // self.block_size
        hits = []
        for key in self.keys(seq, num_blocks):
            block_id = self.block_of.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def register(self, block_id: int, key: bytes) -> None:
        """Key a block whose K/V are now computed. A prefix that another block already holds (two requests with
        the same prompt prefilled side by side) keeps that block; this one stays unkeyed and is freed plainly."""
        if key not in self.block_of and block_id not in self.key_of:
            self.block_of[key] = block_id
            self.key_of[block_id] = key

    def is_cached(self, block_id: int) -> bool:
        return block_id in self.key_of

    def evict_lru(self) -> int:
        """Forget the least recently released evictable block and return its id (now a plain free block)."""
        block_id, _ = self.evictable.popitem(last=False)
        del self.block_of[self.key_of.pop(block_id)]
        return block_id

    def flush(self) -> list[int]:
        """Forget every evictable block (cold-start measurements); returns their ids, now plain free blocks."""
        block_ids = list(self.evictable)
        for block_id in block_ids:
            del self.block_of[self.key_of.pop(block_id)]
        self.evictable.clear()
        return block_ids
