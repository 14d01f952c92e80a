"""Which revision group serves a request while a rollout splits traffic (canary, A/B): docs/contracts.md.

The membership may give groups a `traffic_weight` (an integer 0..100). When no group has one, the newest complete
group serves everything (a plain rollout). When any has one:

1. A request with a variant key (the `X-Tandem-Variant-Key` header, else the OpenAI `user` field) is sticky: the key's
   slot, sha256(key)'s first 8 bytes as a big-endian integer mod 10000, falls into one of the cumulative weight
   ranges of the groups with weight > 0, ordered by revision ascending and scaled to 10000. While the weights stay
   the same, a key always lands on the same group, on every gateway with the same membership.
2. A request without a key, or whose sticky group is not complete, takes a complete group with weight > 0 at random
   in proportion to the weights.
3. When no group with weight > 0 is complete, the newest complete group serves (a group without the key weighs 0).

Nothing here knows workers or HTTP: a group is anything with `revision`, `traffic_weight` and `is_complete`.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Protocol

NUM_SLOTS = 10_000
MAX_TRAFFIC_WEIGHT = 100


class SplitGroup(Protocol):
    revision: int | None
    traffic_weight: int | None

    @property
    def is_complete(self) -> bool: ...


def sticky_slot(key: str) -> int:
    """The key's place in 0..NUM_SLOTS-1: sha256 of its UTF-8 bytes, first 8 bytes big-endian, mod NUM_SLOTS."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % NUM_SLOTS


def is_split(groups: Sequence[SplitGroup]) -> bool:
    """Whether the membership splits traffic: any group carries a traffic_weight."""
    return any(group.traffic_weight is not None for group in groups)


def weighted(groups: Sequence[SplitGroup]) -> list[SplitGroup]:
    """The groups with weight > 0, by revision ascending (the order the sticky ranges are laid out in)."""
    return sorted((g for g in groups if (g.traffic_weight or 0) > 0), key=lambda g: g.revision or 0)


def sticky_group(groups: Sequence[SplitGroup], key: str) -> SplitGroup | None:
    """The group whose cumulative weight range holds the key's slot (complete or not); None when none weighs > 0.

    Slot s lands in group i when cum_{i-1} * N / total <= s < cum_i * N / total, compared in integers."""
    candidates = weighted(groups)
    total = sum(g.traffic_weight for g in candidates)
    if not total:
        return None
    slot = sticky_slot(key)
    cumulative = 0
    for group in candidates:
        cumulative += group.traffic_weight
        if slot * total < cumulative * NUM_SLOTS:
            return group
    raise AssertionError("the last range ends at NUM_SLOTS")  # cumulative == total there


def choose(groups: Sequence[SplitGroup], key: str | None, rng: random.Random) -> SplitGroup | None:
    """The group that serves a request under a split (see the module docstring); None when no group is complete.
    `groups` is newest first, as the router keeps them."""
    if key:
        group = sticky_group(groups, key)
        if group is not None and group.is_complete:
            return group
    complete = [g for g in weighted(groups) if g.is_complete]
    if complete:
        return rng.choices(complete, weights=[g.traffic_weight for g in complete])[0]
    return next((g for g in groups if g.is_complete), None)
