"""Chart data (charts.json, stages.json) of one deployment and range, kept a few seconds when the range is long.

Every open deployment page refetches both every 5 s. A 15-minute range is cheap and must be current; a 24 h range
reads ~100,000 rollup rows to redraw charts whose buckets are 288 s wide, where a figure a few seconds old differs
from a fresh one by nothing an operator can see. So a response is reused for a tenth of its range's bucket step
(whole seconds, at most MAX_AGE_S: 24 h 28 s, 6 h 7 s, 1 h and less never; a deployment younger than its range has
a finer step, so less), by every viewer of that deployment and range; the page says so beside its range buttons. The key carries what the figures draw beside the series (the
deployment's objectives, revision and creation time), so that setting an objective shows on the next refresh.
"""
from __future__ import annotations

import hashlib
import json

from django.core.cache import cache

from controlplane.observability.series import auto_step
from dashboards.panels import RANGES, range_start

MAX_AGE_S = 30
MIN_AGE_S = 2  # below this the cache would save nothing at a 5 s refresh: ranges this short are not cached


def max_age_s(range_key: str, *, start: float = 0.0, end: float | None = None) -> int:
    """Whole seconds a response of this range [start, end) may be reused (0: never); the full range by default."""
    end = start + RANGES[range_key] if end is None else end
    age = min(MAX_AGE_S, int(auto_step(start, end) / 10))
    return age if age >= MIN_AGE_S else 0


def max_ages() -> dict[str, int]:
    """range key → its max_age_s, for the page's note."""
    return {key: max_age_s(key) for key in RANGES}


def _key(kind: str, deployment, range_key: str) -> str:
    drawn = json.dumps([deployment.objectives, deployment.current_revision_id, deployment.created_at.isoformat()],
                       sort_keys=True, default=str)
    return f"dash:{kind}:{deployment.pk}:{range_key}:{hashlib.sha1(drawn.encode()).hexdigest()[:16]}"


def cached_json(kind: str, deployment, range_key: str, build, *, now: float) -> bytes:
    """The JSON body of `build()` (a dict), reused for max_age_s of the deployment's range across requests."""
    age = max_age_s(range_key, start=range_start(deployment, seconds=RANGES[range_key], now=now), end=now)
    key = _key(kind, deployment, range_key)
    if age:
        body = cache.get(key)
        if body is not None:
            return body
    built = build()
    body = json.dumps(built).encode()
    if age and not built.get("error"):  # a backend that did not answer is asked again on the next refresh
        cache.set(key, body, timeout=age)
    return body
