"""Reads behind the fleet overview: each deployment's health, pools, firing alerts and headline numbers; the shared
gateways and what they serve."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.utils.dateparse import parse_datetime

from controlplane.alerting.models import Alert, AlertState
from controlplane.models import Node, SharedGateway, Worker
from controlplane.models.workers import LIVE_STATUSES
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.selectors import deployment_list
from inference.roofline import disturbance

# Headline numbers: the latest value over the last minute. The gateway's client-side view is what users see, so it
# wins; without a gateway series the pool that does the work speaks.
HEADLINE_WINDOW_S = 60
HEADLINES = {
    "ttft_p99": ("ttft_p99_seconds", ("gateway", "prefill", "colocated")),
    "itl_p99": ("itl_p99_seconds", ("gateway", "decode", "colocated")),
    "tokens_per_second": ("generation_tokens_per_second", ("gateway", "decode", "colocated")),
}


class Health:
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"
    DELETING = "deleting"
    SCALED_TO_ZERO = "scaled to zero"


@dataclass
class DeploymentRow:
    deployment: object
    pools: list
    health: str
    num_firing: int
    headlines: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


def deployment_health(*, pools: list, num_firing: int, is_deleting: bool) -> tuple[str, list[str]]:
    """(health, the reasons) from desired vs ready workers per pool and the firing alerts."""
    if is_deleting:
        return Health.DELETING, ["being deleted"]
    problems = []
    down = False
    for pool in pools:
        if pool.desired_replicas and pool.num_ready == 0:
            down = True
            problems.append(f"{pool.role}: no ready worker of {pool.desired_replicas}")
        elif pool.num_ready < pool.desired_replicas:
            problems.append(f"{pool.role}: {pool.num_ready} of {pool.desired_replicas} ready")
        if getattr(pool, "unschedulable_reason", ""):
            problems.append(f"{pool.role} unschedulable: {pool.unschedulable_reason}")
    if num_firing:
        problems.append(f"{num_firing} alert{'s' if num_firing != 1 else ''} firing")
    if down:
        return Health.DOWN, problems
    if problems:
        return Health.DEGRADED, problems
    if pools and all(pool.desired_replicas == 0 for pool in pools):
        return Health.SCALED_TO_ZERO, []
    return Health.HEALTHY, []


def pick_headline(values: dict[str, float | None], roles: tuple[str, ...]) -> float | None:
    """The first role in `roles` with a value (values: role → latest value or None)."""
    for role in roles:
        if values.get(role) is not None:
            return values[role]
    return None


def fleet_rows(*, now: float | None = None) -> list[DeploymentRow]:
    deployments = list(deployment_list())
    firing = Counter(Alert.objects.filter(state=AlertState.FIRING, deployment__isnull=False)
                     .values_list("deployment_id", flat=True))
    latest: dict[str, dict[int, dict[str, float | None]]] = {key: {} for key in HEADLINES}
    unavailable = ""  # the metrics backend did not answer: each row says so under its health, headlines are "–"
    try:
        for key, (metric, _) in HEADLINES.items():
            for value in reader().metric_values(metric=metric, aggregation="last", window_s=HEADLINE_WINDOW_S,
                                                now=now):
                latest[key].setdefault(value.deployment_id, {})[value.role] = value.value
    except MetricsUnavailable as exc:
        latest, unavailable = {key: {} for key in HEADLINES}, f"metrics unavailable: {exc}"
    rows = []
    for deployment in deployments:
        pools = list(deployment.pools.all())
        health, problems = deployment_health(pools=pools, num_firing=firing.get(deployment.pk, 0),
                                             is_deleting=deployment.is_deleting)
        headlines = {key: pick_headline(latest[key].get(deployment.pk, {}), roles)
                     for key, (_, roles) in HEADLINES.items()}
        rows.append(DeploymentRow(deployment=deployment, pools=pools, health=health,
                                  num_firing=firing.get(deployment.pk, 0), headlines=headlines,
                                  problems=problems + ([unavailable] if unavailable else [])))
    return rows


def shared_gateway_rows() -> list[dict]:
    """Each shared gateway: its URL, the deployments it serves, and its process (the newest live gateway row;
    None while none runs)."""
    gateways = list(SharedGateway.objects.select_related("node").prefetch_related("deployments").order_by("name"))
    processes: dict[int, Worker] = {}
    for worker in (Worker.objects.filter(shared_gateway__in=gateways, status__in=LIVE_STATUSES)
                   .select_related("node").order_by("id")):
        processes[worker.shared_gateway_id] = worker
    return [{"gateway": gateway, "deployments": sorted(d.name for d in gateway.deployments.all()),
             "process": processes.get(gateway.pk)} for gateway in gateways]


def node_rows() -> list[dict]:
    live = Counter(Worker.objects.filter(status__in=LIVE_STATUSES, node__isnull=False)
                   .values_list("node_id", flat=True))
    return [{"node": node, "online": node.is_online(), "num_workers": live.get(node.pk, 0), "gpus": node.gpus or [],
             "roofline": roofline_rows(node.roofline)} for node in Node.objects.order_by("name")]


PRECISION_ORDER = ("float32", "bfloat16", "float16", "int8")


def _precision_rank(precision: str) -> tuple[int, str]:
    return (PRECISION_ORDER.index(precision) if precision in PRECISION_ORDER else len(PRECISION_ORDER), precision)


def roofline_rows(roofline: dict | None) -> dict:
    """A node's measured roofline for the page: {"lines": matmul GFLOP/s per precision and read GB/s at one thread
    and at all cores, "measured_at": datetime or None, "simulated": bool}; no lines before its agent has measured."""
    roofline = roofline or {}
    lines = []
    for key, title in (("one_thread", "1 thread"), ("all_cores", "all {threads} cores")):
        figures = roofline.get(key)
        if not figures or (key == "all_cores" and figures.get("threads") == 1):
            continue
        gflops = figures.get("matmul_gflops", {})  # a JSON object: PostgreSQL's jsonb keeps no key order
        peaks = " · ".join(f"{precision} {gflops[precision]:g}" for precision in sorted(gflops, key=_precision_rank))
        lines.append(f"{title.format(threads=figures.get('threads', '?'))}: {peaks} GFLOP/s · "
                     f"read {figures.get('read_gbs', 0):g} GB/s")
    measured_at = roofline.get("measured_at")
    return {"lines": lines, "measured_at": parse_datetime(measured_at) if isinstance(measured_at, str) else None,
            "simulated": roofline.get("source") == "simulated", "disturbed": roofline.get("disturbed") or disturbance(roofline)}
