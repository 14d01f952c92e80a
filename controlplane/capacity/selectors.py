"""Reads of capacity state shared by the capacity API, the capacity and deployment pages and the capacity services:
profiles and profile jobs, schedule rows, and the traffic and live points read from the series (through the
metrics backend's reader, observability.reader: Tandem's own store or Prometheus)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.capacity.models import PoolSchedule, PredictiveScaling, Profile, ProfileJob
from controlplane.capacity.sizing.calibration import fit_vs_live
from controlplane.capacity.sizing.simulation import Traffic
from controlplane.capacity.sizing.windows import Window
from controlplane.errors import ControlPlaneError, invalid, not_found
from controlplane.models import (Deployment, DeploymentMode, Node, Pool, Worker, WorkerPurpose, WorkerRole,
                                 WorkerStatus)
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.supervision.placement import online_nodes

MAX_HOURS = 24 * 7
SCHEDULE_FIELDS = ("name", "cron", "duration_minutes", "timezone", "min_replicas", "max_replicas", "enabled")


# --- profiles and profile jobs ---

def profile_list(deployment: Deployment) -> QuerySet[Profile]:
    """The current revision's profiles, by role and node class (the API's list, the capacity page's section)."""
    return (Profile.objects.filter(revision=deployment.current_revision_id).select_related("revision")
            .order_by("role", "node_class"))


def profiles_by_role(deployment: Deployment, node_class: str | None = None) -> dict[str, Profile]:
    """The current revision's profiles the planner uses, by role: one node class, the given one, else the newest
    profiled."""
    qs = Profile.objects.filter(revision=deployment.current_revision_id).order_by("-updated_at")
    if node_class:
        qs = qs.filter(node_class=node_class)
    profiles: dict[str, Profile] = {}
    for profile in qs:
        if node_class is None:
            node_class = profile.node_class
        if profile.node_class == node_class:
            profiles.setdefault(profile.role, profile)
    return profiles


def profile_job_list(deployment: Deployment, *, limit: int = 10) -> QuerySet[ProfileJob]:
    """The deployment's newest profile jobs first."""
    return (ProfileJob.objects.filter(deployment=deployment).select_related("deployment", "revision")
            .order_by("-created_at")[:limit])


def profile_job_latest(deployment: Deployment) -> ProfileJob | None:
    return next(iter(profile_job_list(deployment, limit=1)), None)


def profile_job_get(job_id: int) -> ProfileJob:
    job = ProfileJob.objects.select_related("deployment", "revision").filter(pk=job_id).first()
    if job is None:
        raise not_found(f"profile job {job_id} does not exist")
    return job



@dataclass(frozen=True, slots=True)
class ProfilePlacement:
    """Where a profile run's worker of one role goes: `node` (None: no node matches), whether it is online, how many
    of the deployment's serving workers run there (a profile next to them would disturb their traffic), and the
    node selector it answers to."""

    node: Node | None
    online: bool
    num_serving: int
    selector: dict


def profile_selector(deployment: Deployment, role: str, node_class: str) -> dict:
    """The role's pool's node selector with the profiled node class as its `class` ("default": any class)."""
    pool = Pool.objects.filter(deployment=deployment, role=role).first()
    selector = {key: value for key, value in ((pool.node_selector if pool else None) or {}).items()
                if key != "class"}
    if node_class != "default":
        selector["class"] = node_class
    return selector


def profile_placement(deployment: Deployment, role: str, node_class: str) -> ProfilePlacement:
    """The node for a profile run's worker of `role`: among the nodes that match profile_selector, an online one
    first, then one without the deployment's serving workers, then the least loaded, then by name."""
    selector = profile_selector(deployment, role, node_class)
    online = set(online_nodes().values_list("id", flat=True))
    live = (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING)
    candidates = []
    for node in Node.objects.all():
        if not node.matches(selector):
            continue
        on_node = Worker.objects.filter(node=node, status__in=live)
        num_serving = (on_node.filter(deployment=deployment, purpose=WorkerPurpose.SERVING)
                       .exclude(status=WorkerStatus.PENDING).exclude(role=WorkerRole.GATEWAY).count())
        candidates.append(((node.id not in online, num_serving > 0, on_node.count(), node.name),
                           ProfilePlacement(node, node.id in online, num_serving, selector)))
    if not candidates:
        return ProfilePlacement(None, False, 0, selector)
    return min(candidates, key=lambda candidate: candidate[0])[1]


# --- schedules and predictive floors ---

def pool_get(deployment: Deployment, role) -> Pool:
    """The deployment's pool of `role`, given as input: 400 naming the field when there is none."""
    if not isinstance(role, str):
        raise invalid("role is required", field="role")
    pool = Pool.objects.select_related("deployment").filter(deployment=deployment, role=role).first()
    if pool is None:
        roles = sorted(deployment.pools.values_list("role", flat=True))
        raise invalid(f"deployment {deployment.name!r} has no {role!r} pool (its pools: {roles})", field="role",
                      role=role)
    return pool


def schedule_get(*, deployment: Deployment, schedule_id: int) -> PoolSchedule:
    schedule = PoolSchedule.objects.select_related("pool__deployment").filter(
        pk=schedule_id, pool__deployment=deployment).first()
    if schedule is None:
        raise not_found(f"deployment {deployment.name!r} has no schedule #{schedule_id}")
    return schedule


def schedule_window(schedule: PoolSchedule) -> Window:
    return Window(schedule.cron, schedule.duration_minutes, schedule.timezone)


def schedule_fields(schedule: PoolSchedule) -> dict:
    """The fields an operator sets, as the API shows them and the audit records them."""
    return {f: getattr(schedule, f) for f in SCHEDULE_FIELDS}


def schedule_rows(pools, *, now: datetime | None = None) -> list[dict]:
    """The schedules of `pools` (in the order given; by name within a pool) with whether each is active now and
    when it next starts: the deployment page, the capacity page and the API."""
    now = now or timezone.now()
    rows = []
    for pool in pools:
        for schedule in pool.schedules.order_by("name"):
            window = schedule_window(schedule)
            rows.append({"id": schedule.pk, "role": pool.role, **schedule_fields(schedule),
                         "active": schedule.enabled and window.is_active(now),
                         "active_until": window.active_until(now) if schedule.enabled else None,
                         "next_start": window.next_start(now)})
    return rows


def predictive_rows(deployment: Deployment) -> dict:
    """Each pool's predictive settings by role (the defaults where a pool has no row yet), with the last floor and
    forecast the autoscaler computed."""
    rows = {p.pool.role: p for p in PredictiveScaling.objects.filter(pool__deployment=deployment)
            .select_related("pool")}
    return {pool.role: {"enabled": rows[pool.role].enabled if pool.role in rows else False,
                        "lead_time_s": rows[pool.role].lead_time_s if pool.role in rows else 900,
                        "history_days": rows[pool.role].history_days if pool.role in rows else 7,
                        "requests_per_replica": rows[pool.role].requests_per_replica if pool.role in rows else None,
                        "last_floor": rows[pool.role].last_floor if pool.role in rows else None,
                        "last_forecast_rps": rows[pool.role].last_forecast_rps if pool.role in rows else None}
            for pool in deployment.pools.order_by("role")}


# --- traffic and live points, from the scraped series ---

def traffic_from_metrics(*, deployment: Deployment, hours: float, now=None) -> Traffic:
    """Mean request rate and prompt/output lengths of the last `hours` of the deployment's series. 400 when there
    was no traffic in that window, 503 when the metrics backend does not answer."""
    if not 0 < hours <= MAX_HOURS:
        raise invalid(f"hours must be within 0..{MAX_HOURS}, not {hours}", field="traffic.hours")
    colocated = deployment.mode == DeploymentMode.COLOCATED
    entry = "colocated" if colocated else "prefill"
    exit_ = "colocated" if colocated else "decode"
    window = hours * 3600

    def mean(metric: str, role: str) -> float | None:
        values = reader().metric_values(metric=metric, deployment=deployment, role=role, aggregation="avg",
                                        window_s=window, now=now)
        value = values[0].value if values else None
        if value is None and window > settings.TANDEM_METRICS_RAW_RETENTION_S:
            # A window past raw retention reads the minute rollups only; a deployment younger than the first
            # rollup still has its raw samples.
            values = reader().metric_values(metric=metric, deployment=deployment, role=role, aggregation="avg",
                                            window_s=settings.TANDEM_METRICS_RAW_RETENTION_S, now=now)
            value = values[0].value if values else None
        return value

    try:
        rate = mean("qps", entry)
        prompt_rate = mean("prompt_tokens_per_second", entry)
        output_rate = mean("generation_tokens_per_second", exit_)
    except MetricsUnavailable as exc:
        raise ControlPlaneError(f"cannot read the traffic of {deployment.name!r}: {exc}; enter a traffic profile "
                                f"by hand", status=503, code="metrics_unavailable") from None
    if not rate or rate <= 0 or not prompt_rate or not output_rate:
        raise invalid(f"no traffic of {deployment.name!r} in the last {hours:g} hours to plan from; enter a traffic "
                      f"profile by hand", field="traffic.hours")
    return Traffic(requests_per_s=rate, prompt_tokens_mean=max(1.0, prompt_rate / rate),
                   output_tokens_mean=max(1.0, output_rate / rate))


def _value(deployment, metric: str, role: str, window_s: float, now: float) -> float | None:
    values = reader().metric_values(metric=metric, deployment=deployment, role=role, aggregation="avg",
                                    window_s=window_s, now=now)
    return values[0].value if values else None


def live_points(deployment: Deployment, *, window_s: float = 300, now: float | None = None) -> dict:
    """{"prefill": [point], "decode": [point]} observed over the last window (empty lists without traffic), at the
    loads operators actually run, as source "live".

    Decode: the pool's P50 inter-token latency is the step time at the batch each worker ran (requests running ÷
    ready workers) and the context of the traffic (mean prompt + half the mean output). Prefill: the P50 TTFT at the
    mean prompt length (it includes the time a prompt waited in the queue; calibration.refit keeps it out of the
    fit). Raises MetricsUnavailable when the metrics backend does not answer."""
    now = time.time() if now is None else now
    colocated = deployment.mode == DeploymentMode.COLOCATED
    entry, exit_ = ("colocated", "colocated") if colocated else ("prefill", "decode")
    qps = _value(deployment, "qps", entry, window_s, now)
    if not qps:
        return {"prefill": [], "decode": []}
    prompt = (_value(deployment, "prompt_tokens_per_second", entry, window_s, now) or 0) / qps
    output = (_value(deployment, "generation_tokens_per_second", exit_, window_s, now) or 0) / qps
    points = {"prefill": [], "decode": []}
    ttft = _value(deployment, "ttft_p50_seconds", entry, window_s, now)
    if ttft is not None and prompt >= 1:
        points["prefill"].append({"prompt_tokens": round(prompt), "batch": 1, "batch_tokens": round(prompt),
                                  "latency_s": ttft, "qps": qps, "source": "live", "ts": now})
    itl = _value(deployment, "itl_p50_seconds", exit_, window_s, now)
    itl_p99 = _value(deployment, "itl_p99_seconds", exit_, window_s, now)
    running = _value(deployment, "requests_running", exit_, window_s, now)
    workers = Worker.objects.filter(deployment=deployment, role=exit_, status=WorkerStatus.READY).count()
    if itl is not None and running and workers:
        batch = max(1.0, running / workers)
        points["decode"].append({"batch": round(batch, 2), "context": round(prompt + output / 2), "step_s": itl,
                                 "step_p99_s": itl_p99, "qps": qps, "source": "live", "ts": now})
    return points


def profile_checks(deployment: Deployment, *, live: dict | None = None, window_s: float = 300,
                   now: float | None = None) -> list[dict]:
    """The planner's profiles (profiles_by_role) against the live points of the last window (`live`, else read),
    or, without traffic now, against the newest live point a profile has stored: calibration.fit_vs_live of each
    stage with both, plus "role" and "node_class" of the profile and "current" (the point is of the last window).
    A profile the live points contradict is named on the capacity page, so that nobody plans from it without a new
    profile."""
    profiles = profiles_by_role(deployment)
    live = live_points(deployment, window_s=window_s, now=now) if live is None else live
    checks = []
    for stage in ("prefill", "decode"):
        profile = profiles.get(stage) or profiles.get("colocated")
        fit = (profile.fits or {}).get(stage) if profile else None
        if not fit:
            continue
        current = bool(live[stage])
        stored = [p for p in (profile.points or {}).get(stage, []) if p.get("source") == "live"]
        point = live[stage][-1] if current else (stored[-1] if stored else None)
        if point is None:
            continue
        checks.append({**fit_vs_live(stage, fit, point), "role": profile.role, "node_class": profile.node_class,
                       "current": current})
    return checks
