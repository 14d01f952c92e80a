"""The per-pool autoscaler: reads the stored series, applies hpa.decide, scales through `pool_scale`.

When it acts: only while the deployment's `autoscale_enabled` and the pool policy's `enabled` are both on.

Manual scaling and the autoscaler do not fight — the rule: **a scale of a pool by anyone but the autoscaler (an
operator through the API or dashboard, an alert rule, an Alertmanager webhook) pauses the autoscaler of that pool
for TANDEM_AUTOSCALE_MANUAL_PAUSE_S (600 s by default)**. The pause is read from the audit log (the latest `scale`
action of the pool whose actor is not the autoscaler), so it needs no hook in the scaling service and survives
restarts. `PUT /api/v1/deployments/{name}/autoscaling` with `"resume": true` ends a pause early, and
`GET` shows `paused_until` and the action that caused it. Manual scales stay within min..max as always.

Every change is a `scale` action with actor type `autoscaler` and the numbers in its reason; evaluations that keep
the size write no row, but the pool's policy keeps the last decision's numbers (`last_decision`, shown by the API).

The gateway's admission queue is a second signal of the pool that bounds admission (ADMISSION_ROLES: decode when the
deployment is disaggregated, colocated otherwise; the gateway admits as many requests as those workers' batches
hold, and prefill capacity does not raise that bound): with the policy's `queue_wait_target` set, a P99 queue wait
over it scales that pool out, and requests waiting in the queue keep it from shrinking (hpa.decide).

A deployment's mode (DeploymentAutoscaling) is `active` (the above) or `advisory`: the same evaluation on the same
inputs, but instead of scaling it records the decision as advice an operator may apply (advice.py). In both modes a
deployment's budget of workers in all caps growth after the step cap and the bounds (budget.py).
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone

from django.conf import settings
from django.db.models import Count

from controlplane.autoscaling.advice import advice_record, advice_settle, advised_action_ids, open_advice
from controlplane.autoscaling.budget import budget_cap, load_budgets
from controlplane.autoscaling.hpa import Bounds, Decision, QueueWait, decide
from controlplane.autoscaling.models import AutoscaleMetric, AutoscaleMode, AutoscalingPolicy, DeploymentAutoscaling
from controlplane.capacity.services.bounds import pool_bounds
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionKind, ActorType, Pool, Worker, WorkerStatus
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.services import pool_scale
from controlplane.services.actions import Actor

log = logging.getLogger(__name__)

ACTOR_NAME = "autoscaler"
# The pools whose workers bound the gateway's admission (inference/gateway/admission.py: the max_num_seqs of each
# ready streaming worker), and so the pools that the queue wait may scale.
ADMISSION_ROLES = ("decode", "colocated")


@dataclass(frozen=True, slots=True)
class Pause:
    until: datetime
    action_id: int
    actor: str


def default_policy_fields(role: str) -> dict:
    """Prefill (and colocated) pools scale on P99 TTFT, decode pools on P99 inter-token latency (settings)."""
    if role == "decode":
        return {"metric": AutoscaleMetric.ITL_P99, "target": settings.TANDEM_AUTOSCALE_ITL_TARGET_MS / 1000}
    return {"metric": AutoscaleMetric.TTFT_P99, "target": settings.TANDEM_AUTOSCALE_TTFT_TARGET_MS / 1000}


def policy_for(pool) -> AutoscalingPolicy:
    policy, _ = AutoscalingPolicy.objects.get_or_create(pool=pool, defaults=default_policy_fields(pool.role))
    return policy


def manual_pause(pool, policy: AutoscalingPolicy, *, now: datetime) -> Pause | None:
    """The pause a recent non-autoscaler scale of this pool imposes, or None (for the API's view)."""
    return _pause_of(pool, policy, load_inputs([pool], now=now.timestamp(), metrics=False), now)


@dataclass(slots=True)
class Inputs:
    """Everything an evaluation reads, loaded for many pools at once (a few queries per pass, not per pool: a pass
    over 200 pools must fit in a 5 s cycle next to the scrape)."""

    latest: dict[tuple[int, str, str], float]  # (deployment, role, metric) → newest pool-aggregate value
    ready: dict[int, int]  # pool id → ready workers
    scale_actions: dict[tuple[int, str], list[tuple]]  # (deployment, role) → [(created_at, id, actor_type, actor,
    #                                                    params)] of recent scales, oldest first
    advised: set[int]  # ids of those scales that carried out the autoscaler's advice: the autoscaler's own


def load_inputs(pools, *, now: float, metrics: bool = True) -> Inputs:
    """The pools' inputs; `metrics=False` leaves out the series (a pause's view needs only the actions). Raises
    MetricsUnavailable when the metrics backend does not answer."""
    deployment_ids = {pool.deployment_id for pool in pools}
    # The newest value of the last three scrapes: one missed scrape does not read as "no data".
    latest = reader().latest_pool_values(deployment_ids=deployment_ids, metrics=(*_OBSERVED, "qps", *_QUEUE),
                                         window_s=3 * settings.TANDEM_SCRAPE_INTERVAL_S, now=now,
                                         roles={pool.role for pool in pools} | {"gateway"}) if metrics else {}
    ready = dict(Worker.objects.filter(pool__in=[p.pk for p in pools], status=WorkerStatus.READY)
                 .values("pool_id").annotate(n=Count("id")).values_list("pool_id", "n"))
    since = datetime.fromtimestamp(now, tz=dt_timezone.utc) - timedelta(
        seconds=max(settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S, settings.TANDEM_AUTOSCALE_STEP_PERIOD_S))
    scale_actions: dict[tuple[int, str], list[tuple]] = defaultdict(list)
    for created_at, pk, deployment_id, actor_type, actor, params in (
            Action.objects.filter(deployment_id__in=deployment_ids, kind=ActionKind.SCALE, created_at__gt=since)
            .order_by("created_at", "id")
            .values_list("created_at", "id", "deployment_id", "actor_type", "actor", "params")):
        if isinstance(params, dict) and params.get("role"):
            scale_actions[(deployment_id, params["role"])].append((created_at, pk, actor_type, actor, params))
    advised = advised_action_ids(deployment_ids, since=since) if scale_actions else set()
    return Inputs(latest=latest, ready=ready, scale_actions=scale_actions, advised=advised)


_OBSERVED = ("ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds", "requests_waiting", "requests_running",
             "kv_cache_usage_ratio")
_QUEUE = ("queue_wait_p99_seconds", "queue_length")  # the gateway's pool aggregates (role "gateway")


def observe(pool, metric: str, inputs: Inputs) -> float | None:
    """The pool's newest value of the policy metric (per-worker metrics: the pool's sum / its ready workers).
    A latency with no data while the pool served no request at all (qps 0) is read as 0: an idle pool may shrink
    toward its min (after the scale-down window)."""
    def latest(name: str) -> float | None:
        return inputs.latest.get((pool.deployment_id, pool.role, name))

    if metric.endswith("_per_worker"):
        total = latest(metric.removesuffix("_per_worker"))
        if total is None:
            return None
        return total / max(inputs.ready.get(pool.pk, 0), 1)
    value = latest(metric)
    if value is None and metric.endswith("_seconds") and latest("qps") == 0:
        return 0.0
    return value


def queue_wait_signal(pool, policy: AutoscalingPolicy, inputs: Inputs) -> QueueWait | None:
    """The gateway queue of the pool's deployment as hpa.decide reads it; None unless the policy sets a queue wait
    target and the pool bounds admission."""
    if policy.queue_wait_target is None or pool.role not in ADMISSION_ROLES:
        return None
    return QueueWait(wait_p99=inputs.latest.get((pool.deployment_id, "gateway", "queue_wait_p99_seconds")),
                     num_queued=inputs.latest.get((pool.deployment_id, "gateway", "queue_length")),
                     target=policy.queue_wait_target)


def _pause_of(pool, policy: AutoscalingPolicy, inputs: Inputs, now: datetime) -> Pause | None:
    pause_s = settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S
    if pause_s <= 0:
        return None
    since = now - timedelta(seconds=pause_s)
    if policy.resumed_at is not None and policy.resumed_at > since:
        since = policy.resumed_at
    manual = [a for a in inputs.scale_actions.get((pool.deployment_id, pool.role), ())
              if a[2] != ActorType.AUTOSCALER and a[1] not in inputs.advised and a[0] > since]
    if not manual:
        return None
    created_at, pk, _, actor, _ = manual[-1]
    return Pause(until=created_at + timedelta(seconds=pause_s), action_id=pk, actor=actor)


def _step_base(pool, current: int, inputs: Inputs, now: datetime) -> int:
    """Replicas at the start of the step period: the `from` of the autoscaler's first scale inside it."""
    since = now - timedelta(seconds=settings.TANDEM_AUTOSCALE_STEP_PERIOD_S)
    for created_at, pk, actor_type, _, params in inputs.scale_actions.get((pool.deployment_id, pool.role), ()):
        own = actor_type == ActorType.AUTOSCALER or pk in inputs.advised
        if own and created_at > since and isinstance(params.get("from"), int):
            return params["from"]
    return current


def autoscale_pool(pool, *, now: float | None = None) -> Decision | None:
    """One evaluation of one pool (see autoscale_pools)."""
    return autoscale_pools([pool], now=now)[0][1]


def autoscale_pools(pools, *, now: float | None = None) -> list[tuple[object, Decision | None]]:
    """One evaluation of each pool; None for a pool whose autoscaler is off or paused.

    1. off (deployment or policy) → nothing; 2. paused by a manual scale → nothing (the decision text says so);
    3. observe the policy metric (and the gateway's queue wait, for a pool that bounds admission); 4. hpa.decide;
    5. hold a scale-up while earlier new workers are not ready yet (their capacity is not in the metric yet; HPA
    likewise discounts unready pods); 6. cap growth by the deployment's budget (budget.py); 7. scale via pool_scale,
    or in advisory mode record the decision as advice (advice.py).
    """
    now_s = time.time() if now is None else now
    now_dt = datetime.fromtimestamp(now_s, tz=dt_timezone.utc)
    pools = list(pools)
    policies = _policies_for(pools)
    active = [p for p in pools if p.deployment.autoscale_enabled and policies[p.pk].enabled]
    try:
        inputs = load_inputs(active, now=now_s) if active else None
        # The floor and ceiling of each pool now: its own min..max narrowed by active schedules, raised by a
        # predictive floor (controlplane.capacity.services.bounds), which reads the series too.
        limits = pool_bounds(active, now=now_dt) if active else {}
    except MetricsUnavailable as exc:
        # No data is not "idle": a pool is neither grown nor shrunk (nor moved to new bounds) until the backend
        # answers again; each policy says why.
        log.warning("autoscaler held, no pool evaluated: %s", exc)
        for pool in active:
            policies[pool.pk].last_decision = f"held: {exc}"[:4000]
            policies[pool.pk].last_evaluated_at = now_dt
        AutoscalingPolicy.objects.bulk_update([policies[p.pk] for p in active],
                                              ["last_decision", "last_evaluated_at"], batch_size=200)
        return [(pool, None) for pool in pools]
    deployment_ids = {pool.deployment_id for pool in active}
    advisory = set(DeploymentAutoscaling.objects.filter(deployment_id__in=deployment_ids, mode=AutoscaleMode.ADVISORY)
                   .values_list("deployment_id", flat=True)) if active else set()
    budgets = load_budgets(deployment_ids) if active else {}
    advice = open_advice([pool.pk for pool in active if pool.deployment_id in advisory]) if advisory else {}
    results, updates = [], []
    for pool in pools:
        policy = policies[pool.pk]
        if pool not in active:
            results.append((pool, None))
            continue
        pause = _pause_of(pool, policy, inputs, now_dt)
        if pause is not None:
            policy.last_decision = (f"paused until {pause.until.isoformat()} by manual scale action "
                                    f"#{pause.action_id} ({pause.actor})")
            policy.last_evaluated_at = now_dt
            updates.append(policy)
            results.append((pool, None))
            continue
        num_ready = inputs.ready.get(pool.pk, 0)
        current = pool.desired_replicas
        limit = limits[pool.pk]
        bounds = Bounds(min_replicas=limit.min_replicas, max_replicas=limit.max_replicas,
                        max_step=settings.TANDEM_AUTOSCALE_MAX_STEP,
                        step_base=_step_base(pool, current, inputs, now_dt))
        observed, queue = observe(pool, policy.metric, inputs), queue_wait_signal(pool, policy, inputs)
        decision, history = decide(
            current=current, observed=observed, target=policy.target,
            tolerance=settings.TANDEM_AUTOSCALE_TOLERANCE_PCT / 100, metric=policy.metric,
            history=[(float(ts), int(n)) for ts, n in policy.recommendations], now=now_s,
            up_window_s=settings.TANDEM_AUTOSCALE_UP_STABILIZATION_S,
            down_window_s=settings.TANDEM_AUTOSCALE_DOWN_STABILIZATION_S, bounds=bounds, queue=queue)
        if decision.desired > current and num_ready < current:
            decision = Decision(current, current, decision.raw,
                                f"{decision.reason}; held: {num_ready} of {current} workers ready, waiting for "
                                f"them before scaling up further")
        if not limit.min_replicas <= decision.desired <= limit.max_replicas:
            # No data (or a held step) leaves the size alone, but a schedule or predictive floor that moved must
            # still be reached: the bounds win.
            desired = min(max(decision.desired, limit.min_replicas), limit.max_replicas)
            decision = Decision(current, desired, decision.raw,
                                f"{decision.reason}; bounds {limit.min_replicas}..{limit.max_replicas} → {desired}")
        budget = budgets[pool.deployment_id]
        decision = budget_cap(decision, budget, floor=limit.min_replicas)
        if limit.why:
            decision = Decision(decision.current, decision.desired, decision.raw,
                                f"{decision.reason} [{limit.why}: {limit.min_replicas}..{limit.max_replicas}]")
        text = decision.reason
        if pool.deployment_id in advisory:
            text = _advise(pool, policy, decision, advice.get(pool.pk), observed=observed, now=now_dt, inputs={
                "num_ready": num_ready, "step_base": bounds.step_base, "max_step": bounds.max_step,
                "min_replicas": limit.min_replicas, "max_replicas": limit.max_replicas, "bounds_why": limit.why,
                "max_workers": budget.max_workers, "num_workers": budget.num_workers,
                **({"queue_wait_p99": queue.wait_p99, "num_queued": queue.num_queued,
                    "queue_wait_target": queue.target} if queue is not None else {})})
            if decision.changes:
                budget.take(decision)
        elif decision.changes:
            try:
                action = pool_scale(deployment=pool.deployment, role=pool.role, replicas=decision.desired,
                                    actor=Actor.autoscaler(ACTOR_NAME), reason=decision.reason,
                                    idempotency_key=f"autoscaler:{pool.pk}:{now_s:.3f}")
                text = f"{text} (action #{action.pk})"
                budget.take(decision)
                log.info("autoscaler scaled %s %d → %d: %s", pool, current, decision.desired, decision.reason)
            except ControlPlaneError as exc:
                log.warning("autoscaler could not scale %s: %s", pool, exc.message)
                text = f"{text}; not applied: {exc.message}"
        policy.last_decision = text[:4000]
        policy.last_evaluated_at = now_dt
        policy.recommendations = [[ts, n] for ts, n in history]
        updates.append(policy)
        results.append((pool, decision))
    AutoscalingPolicy.objects.bulk_update(updates, ["last_decision", "last_evaluated_at", "recommendations"],
                                          batch_size=200)
    return results


def _advise(pool, policy: AutoscalingPolicy, decision: Decision, current, *, observed: float | None, inputs: dict,
            now: datetime) -> str:
    """Advisory mode's last step: a change becomes advice (or confirms the open one), a kept size settles the open
    advice. `inputs`: what else the decision read, kept on the advice. Returns the policy's `last_decision` text."""
    if not decision.changes:
        advice_settle(current=current, decision=decision, now=now)
        return decision.reason
    row = advice_record(pool=pool, decision=decision, current=current, now=now, numbers={
        "metric": policy.metric, "observed": observed, "target": policy.target,
        "ratio": None if observed is None else observed / policy.target, "inputs": inputs})
    return f"{decision.reason} (advice #{row.pk}; advisory mode, not applied)"


def _policies_for(pools) -> dict[int, AutoscalingPolicy]:
    policies = {p.pool_id: p for p in AutoscalingPolicy.objects.filter(pool__in=[pool.pk for pool in pools])}
    missing = [AutoscalingPolicy(pool=pool, **default_policy_fields(pool.role)) for pool in pools
               if pool.pk not in policies]
    if missing:
        AutoscalingPolicy.objects.bulk_create(missing, ignore_conflicts=True)
        policies.update({p.pool_id: p for p in AutoscalingPolicy.objects.filter(
            pool__in=[policy.pool_id for policy in missing])})
    return policies


def autoscale_all(*, now: float | None = None) -> list[tuple[object, Decision | None]]:
    """Evaluate every pool of every deployment whose autoscaling is on. No transaction around the pass: pool_scale
    writes in its own short one (SQLite's write lock)."""
    return autoscale_pools(Pool.objects.filter(deployment__autoscale_enabled=True).select_related("deployment"),
                           now=now)
