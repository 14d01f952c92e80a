"""The real autoscaler's rule as a replay policy: controlplane/autoscaling/autoscaler.py's evaluation of each pool,
on what the replay observes, through the same arithmetic (hpa.decide: the ratio to the target, the tolerance, the
stabilisation windows, the step cap and the bounds).

Per pool, as the real evaluation does: 1. a schedule change (the replay's stand-in for an operator's scale) pauses
the pool's policy for manual_pause_s; 2. the policy metric: a latency P99 over the last interval, read as 0 for a
pool that served nothing (an idle pool may shrink), or a per-worker count, or the KV usage; 3. for the pool that
bounds admission (decode, or colocated) with a queue_wait_target, the gateway queue's P99 wait and length as a
second signal; 4. hpa.decide, its step cap counted from the size before the policy's first change inside the
step period; 5. no scale-up while workers asked for earlier are still starting.

What the replay cannot give it as the fleet does: the real one reads histogram quantiles of scraped series (the
newest of the last scrapes, interpolated within buckets), the replay exact P99s over its interval; the capacity
app's schedules and predictive floors, which narrow min..max in the real evaluation, are not read (the replay's
schedule resizes the pool instead, and pauses this policy as a manual scale would).
"""
from __future__ import annotations

from dataclasses import dataclass

from controlplane.autoscaling.hpa import Bounds, QueueWait, decide

from controlplane.replay.sim.model import Observation, PoolObservation

ADMISSION_ROLES = ("decode", "colocated")  # as controlplane/autoscaling/autoscaler.py's
METRICS = ("ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds", "requests_waiting_per_worker",
           "requests_running_per_worker", "kv_cache_usage_ratio")
# The fleet's defaults (controlplane/settings_fleet.py): TANDEM_AUTOSCALE_TTFT_TARGET_MS, _ITL_TARGET_MS,
# _TOLERANCE_PCT, _UP_STABILIZATION_S, _DOWN_STABILIZATION_S, _MAX_STEP, _STEP_PERIOD_S, _MANUAL_PAUSE_S.
DEFAULT_TTFT_TARGET_S = 1.0
DEFAULT_ITL_TARGET_S = 0.1


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    metric: str
    target: float
    min_replicas: int = 1
    max_replicas: int = 10
    queue_wait_target: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, not {self.metric!r}")
        if not self.target > 0 or not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("target must be > 0 and 0 <= min_replicas <= max_replicas")


def default_pool_policy(role: str, **bounds) -> PoolPolicy:
    """Prefill and colocated pools on P99 TTFT, decode pools on P99 ITL (autoscaler.default_policy_fields)."""
    if role == "decode":
        return PoolPolicy("itl_p99_seconds", DEFAULT_ITL_TARGET_S, **bounds)
    return PoolPolicy("ttft_p99_seconds", DEFAULT_TTFT_TARGET_S, **bounds)


def observe(pool: PoolObservation, metric: str) -> float | None:
    """The pool's value of `metric` (autoscaler.observe)."""
    if metric.endswith("_per_worker"):
        total = pool.waiting if metric == "requests_waiting_per_worker" else pool.running
        return total / max(pool.ready, 1)
    if metric == "kv_cache_usage_ratio":
        return pool.kv_usage
    value = {"ttft_p99_seconds": pool.ttft_p99_s, "itl_p99_seconds": pool.itl_p99_s,
             "e2e_p99_seconds": pool.e2e_p99_s}[metric]
    if value is None and pool.num_served == 0:
        return 0.0
    return value


class AutoscalerPolicy:
    """Role → PoolPolicy; the rest are the fleet's autoscaler settings (defaults as theirs)."""

    def __init__(self, pools: dict[str, PoolPolicy], *, tolerance: float = 0.10, up_window_s: float = 0.0,
                 down_window_s: float = 300.0, max_step: int = 2, step_period_s: float = 60.0,
                 manual_pause_s: float = 600.0) -> None:
        self.pools = dict(pools)
        self.tolerance, self.up_window_s, self.down_window_s = tolerance, up_window_s, down_window_s
        self.max_step, self.step_period_s, self.manual_pause_s = max_step, step_period_s, manual_pause_s
        self.history: dict[str, list[tuple[float, int]]] = {role: [] for role in self.pools}
        self.scales: dict[str, list[tuple[float, int]]] = {role: [] for role in self.pools}  # (when, from)
        self.decisions: list[tuple[float, str, object]] = []  # (now, role, hpa Decision), each evaluation's

    def decide(self, now: float, observed: Observation) -> dict[str, int] | None:
        wanted = {}
        for role, policy in self.pools.items():
            pool = observed.pools.get(role)
            if pool is None:
                continue
            if pool.manual_scale_at is not None and now - pool.manual_scale_at < self.manual_pause_s:
                continue
            current = pool.replicas
            queue = None
            if policy.queue_wait_target is not None and role in ADMISSION_ROLES:
                queue = QueueWait(wait_p99=observed.queue_wait_p99_s, num_queued=observed.queue_length,
                                  target=policy.queue_wait_target)
            bounds = Bounds(min_replicas=policy.min_replicas, max_replicas=policy.max_replicas,
                            max_step=self.max_step, step_base=self._step_base(role, current, now))
            decision, self.history[role] = decide(
                current=current, observed=observe(pool, policy.metric), target=policy.target,
                tolerance=self.tolerance, metric=policy.metric, history=self.history[role], now=now,
                up_window_s=self.up_window_s, down_window_s=self.down_window_s, bounds=bounds, queue=queue)
            desired = decision.desired
            if desired > current and pool.ready < current:
                desired = current  # the workers asked for earlier are not ready: their capacity is not seen yet
            desired = min(max(desired, policy.min_replicas), policy.max_replicas)
            self.decisions.append((now, role, decision))
            if desired != current:
                self.scales[role].append((now, current))
                wanted[role] = desired
        return wanted or None

    def _step_base(self, role: str, current: int, now: float) -> int:
        """Replicas at the start of the step period: the `from` of the policy's first change inside it."""
        for when, before in self.scales[role]:
            if when > now - self.step_period_s:
                return before
        return current
