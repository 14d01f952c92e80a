"""`--test-fault`: a worker that fails or crawls on purpose, so that tests can watch a canary revision go bad.

A test aid, shown on `/health` and `/info` (`test_fault`) so that nobody takes such a worker for a healthy production
one. Its health checks stay ok: a revision that answers errors or runs slow while it looks healthy is exactly what a
canary analysis must catch.

- `error`: every generation request (colocated `/v1/generate`, prefill `/v1/prefill`, decode `/v1/kv` and
  `/v1/stream/{id}`) answers HTTP 500 with a JSON error before it touches the engine.
- `slow:<seconds>`: the worker waits that long before each token it sends (a prefill worker before its one step),
  on the event loop (`asyncio.sleep`), so that /health, /metrics and other requests are not held up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SLOW_S = 600.0


@dataclass(frozen=True, slots=True)
class TestFault:
    __test__ = False  # not a pytest test class, whatever its name

    spec: str            # as given on the command line
    error: bool = False
    delay_s: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> TestFault:
        """'error' or 'slow:<seconds>' (seconds > 0, at most MAX_SLOW_S); ValueError naming what is wrong."""
        if spec == "error":
            return cls(spec, error=True)
        kind, sep, seconds = spec.partition(":")
        if kind != "slow" or not sep:
            raise ValueError(f"must be error or slow:<seconds>, not {spec!r}")
        try:
            delay = float(seconds)
        except ValueError:
            raise ValueError(f"slow:<seconds> needs a number of seconds, not {seconds!r}") from None
        if not math.isfinite(delay) or not 0 < delay <= MAX_SLOW_S:
            raise ValueError(f"slow:<seconds> needs seconds above 0 and at most {MAX_SLOW_S:g}, not {seconds!r}")
        return cls(spec, delay_s=delay)
