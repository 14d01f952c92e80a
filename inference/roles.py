"""The roles of a worker: one engine, one pool, one set of routes each."""
from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """A `str` too, so that command-line values, JSON fields and metric labels stay the plain words."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
