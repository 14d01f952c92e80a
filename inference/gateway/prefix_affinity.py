"""Prefix affinity: requests that begin alike go to the worker that holds their prefix's KV blocks, unless it is
loaded well above the others (consistent hashing with bounded loads, Mirrokni et al. 2018).

The key is the request's leading text, not its tokens (the gateway has no tokenizer): a completion's first
`num_chars` characters of the prompt; a chat's messages up to and including the first user message, rendered as
role and content and cut at `num_chars`. All turns of one conversation share that head (its system prompt and first
user message), so they stay on one worker and find their history cached there; conversations under one long system
prompt share a key too, and with a short system prompt they spread by their first user message. A prompt shorter
than `num_chars` is its own key.

The ring: each worker of a role sits at VNODES_PER_WEIGHT x weight points (at least one) on a 64-bit ring, hashed
from its URL, so a worker joining or leaving moves only the keys next to its points. A request walks the ring
clockwise from its key's hash and takes the first worker (ready, not excluded) whose outstanding requests, the one
being placed included, are at most ceil(LOAD_FACTOR x the average per unit of weight x its weight) + HEADROOM. The
first worker on the walk is the key's home: taking it is an affinity hit, a later one a spill, and a spilled key
goes on to the same next worker each time, so its prefix gets cached there as well.

HEADROOM: the bound alone is harsh at the small counts a prefill stage holds (its requests last one prefill): with
4 workers and 3 requests in flight it is ceil(1.25 x 3 / 4) = 1, so a home holding one request would spill the next
of its key, although being one or two prefills behind is not "loaded well above the others" and costs less than
the cache miss a spill makes (a hit skips most of a prompt's prefill). Without headroom, a run with as many clients
as prefill workers spilled a large share of its requests and lost much of the possible hit rate. Under real load
the LOAD_FACTOR term dominates and the headroom is noise.
"""
from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from typing import Protocol

LOAD_FACTOR = 1.25
HEADROOM = 2  # requests a worker may hold above the bound (see the module docstring)
VNODES_PER_WEIGHT = 100
DEFAULT_NUM_CHARS = 256  # ~64 tokens of English: the first 4 KV blocks of 16 tokens


class RingWorker(Protocol):
    url: str
    weight: float
    num_outstanding: int


def affinity_key(worker_body: dict, num_chars: int = DEFAULT_NUM_CHARS) -> str | None:
    """The leading text that decides a request's worker (see the module docstring); None when the body has none."""
    prompt = worker_body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:num_chars]
    messages = worker_body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    parts, length = [], 0
    for message in messages:
        if not isinstance(message, dict):
            break
        part = f"{message.get('role')}\x1f{message.get('content')}\x1e"
        parts.append(part)
        length += len(part)
        if message.get("role") == "user" or length >= num_chars:
            break
    return "".join(parts)[:num_chars]


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Points of the workers given as (url, weight); `walk` answers indexes into that list."""

    def __init__(self, members: Sequence[tuple[str, float]]):
        points = []
        for index, (url, weight) in enumerate(members):
            for vnode in range(max(1, round(VNODES_PER_WEIGHT * weight))):
                points.append((_point(f"{url}#{vnode}"), index))
        points.sort()
        self._hashes = [h for h, _ in points]
        self._owners = [index for _, index in points]
        self.num_members = len(members)

    def walk(self, key: str) -> list[int]:
        """Every member's index once, in the order met walking clockwise from the key's hash."""
        start = bisect.bisect(self._hashes, _point(key))
        seen: dict[int, None] = {}
        n = len(self._owners)
        for i in range(n):
            seen.setdefault(self._owners[(start + i) % n], None)
            if len(seen) == self.num_members:
                break
        return list(seen)


def bounded_pick(ring: HashRing, members: Sequence[RingWorker], key: str, candidates: Sequence[RingWorker],
                 max_outstanding: int) -> tuple[RingWorker | None, bool]:
    """The worker for `key` among `candidates` (those of `members`, the ring's workers in its order, that may take
    it now) and whether it is the key's home; (None, False) when none is under both the bound and
    `max_outstanding`."""
    allowed = {id(w) for w in candidates}
    total_weight = sum(w.weight for w in candidates)
    total_load = sum(w.num_outstanding for w in candidates) + 1  # the request being placed
    home = True
    for index in ring.walk(key):
        worker = members[index]
        if id(worker) not in allowed:
            continue
        capacity = math.ceil(LOAD_FACTOR * total_load * worker.weight / total_weight) + HEADROOM
        if worker.num_outstanding + 1 <= capacity and worker.num_outstanding < max_outstanding:
            return worker, home
        home = False
    return None, False
