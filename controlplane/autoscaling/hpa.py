"""The autoscaler's arithmetic, Kubernetes HPA's algorithm for one pool. Pure, no Django: one call = one evaluation.

1. desired = ceil(current × observed / target); no change while |observed / target − 1| ≤ tolerance.
   A pool at 0 replicas with a metric above target asks for 1 (the product would stay 0).
2. Stabilisation (HPA's behaviour.*.stabilizationWindowSeconds): the recommendation of every evaluation is kept;
   scaling up goes to the *lowest* recommendation of the up window (0 s: the current one), scaling down to the
   *highest* of the down window (300 s): a dip must last the whole window before the pool shrinks. With no
   recommendation kept yet, the current size seeds the history.
3. Step: at most ±max_step replicas relative to the replicas at the start of the step period (`step_base`).
4. Bounds: min..max of the pool.

The gateway's admission queue (`QueueWait`, the pool that bounds admission only) is a second signal, as HPA takes
several metrics: when its P99 wait is over its target (beyond the tolerance), step 1 takes the larger of the two
recommendations, so the pool grows even while its own metric looks fine (a TTFT read from the workers does not see
the time a request spent queued before it reached one). It never argues for shrinking; instead, while any request
waits in the queue, the pool does not shrink (after step 2): a queue means the pool is already too small.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# ceil(2 × 1.5) must be 3, not 4 because 2 × 1.5000000001 came out of a float division.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Decision:
    current: int
    desired: int
    raw: int | None  # step 1's recommendation; None without data
    reason: str

    @property
    def changes(self) -> bool:
        return self.desired != self.current


@dataclass(frozen=True, slots=True)
class Bounds:
    min_replicas: int
    max_replicas: int
    max_step: int
    step_base: int  # replicas at the start of the step period


@dataclass(frozen=True, slots=True)
class QueueWait:
    """The gateway admission queue of the pool's deployment: the P99 wait of the requests admitted over the scrape
    window (None: none admitted), the requests waiting now (None: no reading) and the operator's target wait."""
    wait_p99: float | None
    num_queued: float | None
    target: float


def recommend(current: int, observed: float, target: float, tolerance: float) -> tuple[int, float]:
    """Step 1: (recommended replicas, ratio)."""
    if target <= 0:
        raise ValueError(f"target must be positive, not {target}")
    ratio = observed / target
    if abs(ratio - 1.0) <= tolerance:
        return current, ratio
    if current == 0:
        return (1 if ratio > 1.0 else 0), ratio
    return max(0, math.ceil(current * ratio - _EPSILON)), ratio


def stabilize(current: int, raw: int, history: list[tuple[float, int]], now: float, up_window_s: float,
              down_window_s: float) -> int:
    """Step 2: `raw` is this evaluation's recommendation, `history` the earlier ones [(ts, replicas)]. As in the
    HPA controller, a window holds the recommendations strictly newer than now − window, plus the current one."""
    up = min([raw] + [n for ts, n in history if ts > now - up_window_s])
    down = max([raw] + [n for ts, n in history if ts > now - down_window_s])
    return min(max(current, up), down)


def decide(*, current: int, observed: float | None, target: float, tolerance: float, metric: str,
           history: list[tuple[float, int]], now: float, up_window_s: float, down_window_s: float,
           bounds: Bounds, queue: QueueWait | None = None) -> tuple[Decision, list[tuple[float, int]]]:
    """One evaluation. Returns the decision and the recommendation history to keep for the next one."""
    keep = max(up_window_s, down_window_s)
    history = [(ts, n) for ts, n in history if ts >= now - keep]
    queue_raw, queue_text = _queue_recommendation(current, queue, tolerance)
    if observed is None and queue_raw is None:
        return Decision(current, current, None, f"{metric}: no data in the window, keeping {current}"
                        + (f"; {queue_text}" if queue_text else "")), history
    if observed is None:
        raw, reason = queue_raw, f"{metric}: no data in the window"
    else:
        raw, ratio = recommend(current, observed, target, tolerance)
        within = abs(ratio - 1.0) <= tolerance
        reason = (
            f"{metric} {observed:.4g} vs target {target:.4g} (ratio {ratio:.3f}"
            f"{', within' if within else ', outside'} tolerance {tolerance:.0%}): "
            f"ceil({current} × {ratio:.3f}) = {raw}" if not within else
            f"{metric} {observed:.4g} vs target {target:.4g} (ratio {ratio:.3f}, within tolerance {tolerance:.0%}): "
            f"recommend {raw}"
        )
        if queue_raw is not None and queue_raw > raw:
            raw = queue_raw
    if queue_text:
        reason += f"; {queue_text}"
    if not history:
        # A fresh (or re-enabled, or long silent) autoscaler counts the current size as a recommendation made now:
        # the first low reading must also last a whole down window before the pool shrinks.
        history.append((now, current))
    stabilized = stabilize(current, raw, history, now, up_window_s, down_window_s)
    history.append((now, raw))
    if stabilized < current and queue is not None and queue.num_queued:
        stabilized = current
        reason += f"; no scale-in while {queue.num_queued:g} requests wait in the gateway's admission queue"
    low = max(bounds.min_replicas, bounds.step_base - bounds.max_step)
    high = min(bounds.max_replicas, bounds.step_base + bounds.max_step)
    # The pool bounds win over the step bounds (a pool below its new min must reach it).
    desired = min(max(stabilized, low), high)
    desired = min(max(desired, bounds.min_replicas), bounds.max_replicas)
    reason += (f"; stabilized {stabilized} (up window {up_window_s:g}s, down window {down_window_s:g}s)"
               f"; step ±{bounds.max_step} from {bounds.step_base}, bounds {bounds.min_replicas}..{bounds.max_replicas}"
               f" → {desired} replicas (was {current})")
    return Decision(current, desired, raw, reason), history


def _queue_recommendation(current: int, queue: QueueWait | None, tolerance: float) -> tuple[int | None, str]:
    """(replicas the queue wait asks for, or None when it asks for nothing; the words for the reason)."""
    if queue is None:
        return None, ""
    if queue.wait_p99 is None:
        return None, f"queue wait: no request admitted in the window (target {queue.target:g} s)"
    raw, ratio = recommend(current, queue.wait_p99, queue.target, tolerance)
    if ratio <= 1.0 + tolerance:
        return None, f"queue wait P99 {queue.wait_p99:.3g} s <= target {queue.target:g} s"
    return raw, (f"queue wait P99 {queue.wait_p99:.3g} s > target {queue.target:g} s: "
                 f"ceil({current} × {ratio:.3f}) = {raw}")
