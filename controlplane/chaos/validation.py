"""Checks of an experiment's fields: name, duration, target, hypothesis, abort conditions; each 400 names its
field ("hypothesis[1].max"). The faults' checks, which read the agent's registry of fault kinds, are fault_checks.py."""
from __future__ import annotations

from django.conf import settings

from controlplane.errors import invalid
from controlplane.models import Node, WorkerPurpose, WorkerRole, WorkerStatus
from controlplane.observability.catalog import METRICS
from controlplane.observability.series import AGGREGATIONS
from controlplane.services.validation import NAME_RE, each_object
from inference.checks import is_number

# Read from the gateway's counters at two of its scrapes (readings.py): over the check's window, or over the scrape
# interval when that is longer.
GATEWAY_METRICS = ("error_ratio", "server_error_ratio", "ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds",
                   "requests")
READY_WORKERS = "ready_workers"  # Worker rows of the role that are ready, now
POOL_ROLES = (WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED)
MAX_WINDOW_S = 120  # the longest window a check reads: one read of the gateway's scrapes per pass covers them all
MAX_CHECKS = 20
MAX_TARGET_COUNT = 64
DEFAULT_CHECK_WINDOW_S = 10
DEFAULT_ABORT_WINDOW_S = 5
_CHECK_BOUNDS = ("max", "min", "max_baseline_ratio")
_ABORT_BOUNDS = ("above", "below")


def number(value, *, field: str, low: float, high: float, integer: bool = False):
    if isinstance(value, bool) or not is_number(value) or (integer and not float(value).is_integer()) \
            or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise invalid(f"{field} must be {kind} in {low:g}..{high:g}, not {value!r}", field=field)
    return int(value) if integer else float(value)


def unknown_fields(item: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(item) - set(allowed))
    if unknown:
        raise invalid(f"{where}.{unknown[0]} is not a field here; known: {', '.join(allowed)}",
                      field=f"{where}.{unknown[0]}")


def validate_experiment_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid(f"name {name!r} must be 1-63 lowercase letters, digits or '-', starting and ending with a "
                      "letter or digit", field="name")
    return name


def validate_duration(duration_s) -> float:
    return number(duration_s, field="duration_s", low=1, high=settings.TANDEM_CHAOS_MAX_DURATION_S)


def validate_target(target, roles: set[str]) -> dict:
    """{"role": R, "count": N} or {"role": R, "percent": P}; R a pool role of the deployment, or "gateway";
    optionally "revision": the workers of that revision only (a canary's). Or {"node": name}: the deployment's
    workers on that node, all of them unless count or percent picks some, narrowed by role and revision when given
    (that the node exists and holds such a worker is validate_target_node's, which reads the database)."""
    if not isinstance(target, dict):
        raise invalid("target must be an object: {\"role\": \"decode\", \"count\": 1} or {\"node\": \"gpu-1\"}",
                      field="target")
    unknown_fields(target, ("role", "node", "count", "percent", "revision"), "target")
    cleaned = {}
    if "node" in target:
        # Any name a node registered with (its agent's TANDEM_NODE_NAME, not checked there): the fleet says.
        if not isinstance(target["node"], str) or not 1 <= len(target["node"]) <= 63:
            raise invalid(f"target.node {target['node']!r} must be a node's name (1-63 characters)",
                          field="target.node")
        cleaned["node"] = target["node"]
    role = target.get("role")
    if role not in roles and (role is not None or "node" not in cleaned):
        raise invalid(f"target.role {role!r} is not a role of this deployment; it has {', '.join(sorted(roles))}",
                      field="target.role")
    if role is not None:
        cleaned["role"] = role
    if "count" in target and "percent" in target:
        raise invalid("target takes count or percent, not both", field="target.percent")
    if "percent" in target:
        cleaned["percent"] = number(target["percent"], field="target.percent", low=1, high=100, integer=True)
    elif "count" in target or "node" not in cleaned:  # a node's workers: all of them by default
        cleaned["count"] = number(target.get("count", 1), field="target.count", low=1, high=MAX_TARGET_COUNT,
                                   integer=True)
    if "revision" in target:
        cleaned["revision"] = number(target["revision"], field="target.revision", low=1, high=1 << 31,
                                      integer=True)
    return cleaned


def validate_target_node(target: dict, deployment) -> None:
    """A node target's node: registered, and holding a worker of the deployment (of the target's role and revision)
    that is not stopped or failed: every fault reaches its node through a target worker (a node-level one, too, is
    carried by the agent that owns that worker). 400 naming target.node otherwise. Whether it still holds a ready
    one is the run start's to judge (a 409)."""
    if "node" not in target:
        return
    node = Node.objects.filter(name=target["node"]).first()
    if node is None:
        known = list(Node.objects.order_by("name").values_list("name", flat=True)[:10])
        raise invalid(f"target.node {target['node']!r} is not a registered node; nodes: {', '.join(known) or 'none'}",
                      field="target.node")
    workers = deployment.workers.filter(node=node, purpose=WorkerPurpose.SERVING).exclude(
        status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED))
    if "role" in target:
        workers = workers.filter(role=target["role"])
    if "revision" in target:
        workers = workers.filter(revision__number=target["revision"])
    if not workers.exists():
        which = " ".join(filter(None, (target.get("role"), f"revision {target['revision']}" if "revision" in target
                                       else "")))
        raise invalid(f"target.node {node.name!r} runs no {which + ' ' if which else ''}worker of deployment "
                      f"{deployment.name!r}, and every fault reaches its node through a target worker",
                      field="target.node")


def _metric(item: dict, where: str, roles: set[str]) -> tuple[str, str]:
    metric = item.get("metric")
    role = item.get("role")
    if metric in GATEWAY_METRICS:
        if role not in (None, WorkerRole.GATEWAY):
            raise invalid(f"{where}.role: {metric} is read from the gateway's counters (role gateway)",
                          field=f"{where}.role")
        return metric, WorkerRole.GATEWAY
    if metric == READY_WORKERS or metric in METRICS:
        pool_roles = sorted(roles - {WorkerRole.GATEWAY})
        if role not in pool_roles:
            raise invalid(f"{where}.role {role!r} must name a pool of this deployment ({', '.join(pool_roles)})",
                          field=f"{where}.role")
        return metric, role
    raise invalid(f"{where}.metric {metric!r} is unknown; known: {', '.join(GATEWAY_METRICS)}, {READY_WORKERS}, "
                  "or a stored series of a pool (GET /api/v1/metrics/query lists them)", field=f"{where}.metric")


def _windowed(item: dict, where: str, metric: str, default_window: int) -> dict:
    extra = {}
    if metric != READY_WORKERS:
        extra["window_s"] = number(item.get("window_s", default_window), field=f"{where}.window_s", low=1,
                                    high=MAX_WINDOW_S, integer=True)
    elif "window_s" in item:
        raise invalid(f"{where}.window_s: ready_workers is read now, not over a window", field=f"{where}.window_s")
    if metric not in GATEWAY_METRICS and metric != READY_WORKERS:
        aggregation = item.get("aggregation", "max")
        if aggregation not in AGGREGATIONS:
            raise invalid(f"{where}.aggregation {aggregation!r} is not one of {', '.join(AGGREGATIONS)}",
                          field=f"{where}.aggregation")
        extra["aggregation"] = aggregation
    elif "aggregation" in item:
        raise invalid(f"{where}.aggregation is for stored series only", field=f"{where}.aggregation")
    return extra


def validate_hypothesis(checks, roles: set[str]) -> list[dict]:
    """1..20 checks, each one metric with exactly one bound: max, min or max_baseline_ratio (at most this many
    times its value before the fault)."""
    if not isinstance(checks, list) or not 1 <= len(checks) <= MAX_CHECKS:
        raise invalid(f"hypothesis must be a list of 1 to {MAX_CHECKS} checks", field="hypothesis")
    cleaned = []
    for where, check in each_object(checks, field="hypothesis"):
        unknown_fields(check, ("metric", "role", *_CHECK_BOUNDS, "window_s", "aggregation"), where)
        metric, role = _metric(check, where, roles)
        bounds = [key for key in _CHECK_BOUNDS if key in check]
        if len(bounds) != 1:
            raise invalid(f"{where} needs exactly one of {', '.join(_CHECK_BOUNDS)}", field=f"{where}.max")
        bound = bounds[0]
        if bound == "max_baseline_ratio":
            if metric in (READY_WORKERS, "requests"):
                raise invalid(f"{where}.max_baseline_ratio is for rates, ratios and latencies, not {metric}",
                              field=f"{where}.max_baseline_ratio")
            value = number(check[bound], field=f"{where}.{bound}", low=1, high=1000)
        else:
            value = number(check[bound], field=f"{where}.{bound}", low=0, high=1e12)
        cleaned.append({"metric": metric, "role": role, bound: value,
                        **_windowed(check, where, metric, DEFAULT_CHECK_WINDOW_S)})
    return cleaned


def validate_abort_conditions(conditions, roles: set[str]) -> list[dict]:
    """0..20 conditions, each one metric with `above` or `below`, over `window_s`, breached for `for_s` on end
    (0: the first pass that sees it aborts)."""
    if conditions is None:
        return []
    if not isinstance(conditions, list) or len(conditions) > MAX_CHECKS:
        raise invalid(f"abort_conditions must be a list of at most {MAX_CHECKS} conditions",
                      field="abort_conditions")
    cleaned = []
    for where, condition in each_object(conditions, field="abort_conditions"):
        unknown_fields(condition, ("metric", "role", *_ABORT_BOUNDS, "window_s", "for_s", "aggregation"), where)
        metric, role = _metric(condition, where, roles)
        bounds = [key for key in _ABORT_BOUNDS if key in condition]
        if len(bounds) != 1:
            raise invalid(f"{where} needs exactly one of above, below", field=f"{where}.above")
        cleaned.append({"metric": metric, "role": role,
                        bounds[0]: number(condition[bounds[0]], field=f"{where}.{bounds[0]}", low=0, high=1e12),
                        "for_s": number(condition.get("for_s", 0), field=f"{where}.for_s", low=0, high=3600),
                        **_windowed(condition, where, metric, DEFAULT_ABORT_WINDOW_S)})
    return cleaned


def validate_recovery_timeout(value) -> float:
    return number(value, field="recovery_timeout_s", low=1, high=3600)
