"""Checks of an experiment's fields: target, faults, duration, hypothesis, abort conditions; each 400 names its
field ("hypothesis[1].max")."""
from __future__ import annotations

import socket
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.agent.control_faults import SQLITE_MAX_MS, broker_here, database_here
from controlplane.agent.faults import FAULT_KINDS
from controlplane.agent.proxy_faults import KV_KINDS, PROXY_KINDS
from controlplane.agent.resource_faults import GPU_KIND, MEMORY_FRACTION, RESOURCE_KINDS
from controlplane.errors import invalid
from controlplane.models import Node, Worker, WorkerPurpose, WorkerRole, WorkerStatus
from controlplane.observability.catalog import METRICS
from controlplane.observability.series import AGGREGATIONS
from controlplane.services.validation import NAME_RE, each_object
from inference.checks import is_number

# Read from the gateway's own counters over exactly the check's window (hypothesis.gateway_numbers).
GATEWAY_METRICS = ("error_ratio", "server_error_ratio", "ttft_p99_seconds", "itl_p99_seconds", "e2e_p99_seconds",
                   "requests")
READY_WORKERS = "ready_workers"  # Worker rows of the role that are ready, now
POOL_ROLES = (WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.COLOCATED)
MAX_WINDOW_S = 120  # the gateway samples kept cover this much (and a margin)
MAX_FAULTS = 10
MAX_CHECKS = 20
MAX_TARGET_COUNT = 64
DEFAULT_CHECK_WINDOW_S = 10
DEFAULT_ABORT_WINDOW_S = 5
_CHECK_BOUNDS = ("max", "min", "max_baseline_ratio")
_ABORT_BOUNDS = ("above", "below")


def _number(value, *, field: str, low: float, high: float, integer: bool = False):
    if isinstance(value, bool) or not is_number(value) or (integer and not float(value).is_integer()) \
            or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise invalid(f"{field} must be {kind} in {low:g}..{high:g}, not {value!r}", field=field)
    return int(value) if integer else float(value)


def _unknown(item: dict, allowed: tuple[str, ...], where: str) -> None:
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
    return _number(duration_s, field="duration_s", low=1, high=settings.TANDEM_CHAOS_MAX_DURATION_S)


def validate_target(target, roles: set[str]) -> dict:
    """{"role": R, "count": N} or {"role": R, "percent": P}; R a pool role of the deployment, or "gateway";
    optionally "revision": the workers of that revision only (a canary's). Or {"node": name}: the deployment's
    workers on that node, all of them unless count or percent picks some, narrowed by role and revision when given
    (that the node exists and holds such a worker is validate_target_node's, which reads the database)."""
    if not isinstance(target, dict):
        raise invalid("target must be an object: {\"role\": \"decode\", \"count\": 1} or {\"node\": \"gpu-1\"}",
                      field="target")
    _unknown(target, ("role", "node", "count", "percent", "revision"), "target")
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
        cleaned["percent"] = _number(target["percent"], field="target.percent", low=1, high=100, integer=True)
    elif "count" in target or "node" not in cleaned:  # a node's workers: all of them by default
        cleaned["count"] = _number(target.get("count", 1), field="target.count", low=1, high=MAX_TARGET_COUNT,
                                   integer=True)
    if "revision" in target:
        cleaned["revision"] = _number(target["revision"], field="target.revision", low=1, high=1 << 31,
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


# The settings of each fault kind beyond `kind` and `duration_s`: (field, low, high, default; None: required). A
# bound named by a string is that setting's value; a default OPTIONAL, a setting left out when not given.
OPTIONAL = object()
DISK_FILL_BOUND = "TANDEM_CHAOS_DISK_FILL_MAX_MIB"
FAULT_PARAMS = {
    "kill": {}, "pause": {},
    "error": {"ratio": (0.01, 1, 1.0)},  # the fraction of generation requests answered 500
    "latency": {"ms": (1, 60_000, None), "line_ms": (0, 10_000, 0)},  # before each request; each streamed line
    "reset": {"ratio": (0.01, 1, 1.0)},  # the fraction of generation requests whose connection is cut
    # Every connection to the worker held unanswered, health checks included, from `onset_s` after the proxy takes
    # the worker's place (gateways poll the membership every 2 s by default: then it cuts requests in flight too).
    "partition": {"onset_s": (0, 60, 5)},
    # On the prefill -> decode KV push only (a decode worker's KV address), as latency, reset, and bytes flipped:
    "kv_latency": {"ms": (1, 60_000, None)},
    "kv_reset": {"ratio": (0.01, 1, 1.0)},
    "kv_corrupt": {"ratio": (0.01, 1, 1.0), "bytes": (1, 1024, 1)},  # the fraction of pushes; bytes flipped in each
    "cpu_hog": {"workers": (1, 256, 1)},  # busy processes on the target worker's host
    "memory_pressure": {"mib": (1, 1 << 20, None)},  # MiB allocated and touched on the target worker's host
    # MiB allocated and written on one GPU of the host: `gpu` (a Node.gpus index), else the target worker's, else 0.
    GPU_KIND: {"mib": (1, 1 << 20, None), "gpu": (0, 255, OPTIONAL)},
    # One file under the host's var/ folder, as large as leaves free_mib MiB free there, but at most max_mib MiB.
    "disk_fill": {"free_mib": (0, 1 << 20, 64), "max_mib": (1, DISK_FILL_BOUND, DISK_FILL_BOUND)},
    # The Celery broker hangs for the duration (by an agent on the broker's host: broker_freeze_carrier); the
    # target's deployment is the one whose clients the hypothesis reads.
    "broker_freeze": {},
    "agent_kill": {},  # SIGKILL the node agent of the target worker's host; its supervisor starts it again
    # Every statement of the control plane's database slowed: its server stopped (SQLite: its write lock held) `ms`
    # out of every 100 ms, by an agent on the database's host (db_slow_carrier).
    "db_slow": {"ms": (1, 90, 50)},
}
INSTANT_KINDS = ("kill", "agent_kill")  # over at once: no duration of their own
INTEGER_PARAMS = ("workers", "mib", "bytes", "free_mib", "max_mib", "gpu")


def fault_params(fault: dict) -> dict:
    """A validated fault's own settings (what the agent passes to the fault proxy)."""
    return {key: fault[key] for key in FAULT_PARAMS[fault["kind"]] if key in fault}


def validate_faults(faults, duration_s: float, role: str | None = None) -> list[dict]:
    """The faults, each with its settings; `role`, the target's (None: a node target's workers of any role): a KV
    fault needs decode workers."""
    if not isinstance(faults, list) or not 1 <= len(faults) <= MAX_FAULTS:
        raise invalid(f"faults must be a list of 1 to {MAX_FAULTS} faults", field="faults")
    cleaned = []
    for where, fault in each_object(faults, field="faults"):
        kind = fault.get("kind")
        if kind not in FAULT_KINDS:
            raise invalid(f"{where}.kind {kind!r} is not a fault this version carries out; known: "
                          f"{', '.join(FAULT_KINDS)}", field=f"{where}.kind")
        _unknown(fault, ("kind", *(() if kind in INSTANT_KINDS else ("duration_s",)), *FAULT_PARAMS[kind]), where)
        if kind in KV_KINDS and role != WorkerRole.DECODE:
            raise invalid(f"{where}.kind {kind} faults the KV push from prefill to decode workers: target.role must "
                          f"be decode, not {role!r}" + (" (a node target takes one to narrow it)" if role is None
                                                       else ""), field=f"{where}.kind")
        item = {"kind": kind}
        if "duration_s" in fault:  # else the experiment's duration, whatever it is changed to
            item["duration_s"] = _number(fault["duration_s"], field=f"{where}.duration_s", low=1, high=duration_s)
        for key, (low, high, default) in FAULT_PARAMS[kind].items():
            high, default = (getattr(settings, v) if isinstance(v, str) else v for v in (high, default))
            if key not in fault and default is None:
                raise invalid(f"{where}.{key} is required for a {kind} fault", field=f"{where}.{key}")
            if key not in fault and default is OPTIONAL:
                continue
            item[key] = _number(fault.get(key, default), field=f"{where}.{key}", low=low, high=high,
                                integer=key in INTEGER_PARAMS)
        lasts = item.get("duration_s", duration_s)
        if kind == "partition" and item["onset_s"] >= lasts:
            raise invalid(f"{where}.onset_s: the partition would begin {item['onset_s']:g} s in, when the fault's "
                          f"{lasts:g} s are over; give a shorter onset_s (default 5) or a longer duration_s",
                          field=f"{where}.onset_s")
        cleaned.append(item)
    proxied = [index for index, fault in enumerate(cleaned) if fault["kind"] in PROXY_KINDS]
    if len(proxied) > 1:
        # Each would put a fault proxy in front of the same workers, and undoing one would cut the other's path.
        raise invalid(f"faults[{proxied[1]}]: an experiment takes one of {', '.join(PROXY_KINDS)} (a fault proxy "
                      "in front of each target worker), not several", field=f"faults[{proxied[1]}].kind")
    return cleaned


def validate_memory_pressure(faults: list[dict], nodes) -> None:
    """At run start: a memory_pressure fault asks at most MEMORY_FRACTION of the memory each target node registered
    (detected_labels memory_gib; a node that registered none is judged by its agent, which refuses more than that
    fraction of what it has available)."""
    for index, fault in enumerate(faults):
        if fault["kind"] != "memory_pressure":
            continue
        for node in nodes:
            gib = (node.detected_labels or {}).get("memory_gib")
            if is_number(gib) and fault["mib"] > gib * 1024 * MEMORY_FRACTION:
                limit = int(gib * 1024 * MEMORY_FRACTION)
                raise invalid(f"faults[{index}].mib: {fault['mib']:g} MiB is more than {MEMORY_FRACTION:g} of node "
                              f"{node.name!r}'s memory ({limit} MiB)", field=f"faults[{index}].mib")


def validate_gpu_memory(faults: list[dict], targets: list[dict], nodes) -> None:
    """At run start: a gpu_memory fault needs a GPU on each target node (Node.gpus, from the agent's NVML discovery:
    empty on a CPU host), the one it names (`gpu`, else the worker's that carries it: the node's first target's
    Worker.gpu_index, else 0, as the agent chooses), and at most that GPU's memory. 400 naming faults[i].kind (no
    GPU), faults[i].gpu (no such GPU) or faults[i].mib (more than it has)."""
    by_name = {node.name: node for node in nodes}
    first = {}  # node name -> the worker that carries a node-level fault there (services._fault_messages)
    for target in targets:
        first.setdefault(target["node"], target["worker"])
    gpu_index = dict(Worker.objects.filter(pk__in=first.values()).values_list("pk", "gpu_index"))
    for index, fault in enumerate(faults):
        if fault["kind"] != GPU_KIND:
            continue
        where = f"faults[{index}]"
        for name, worker in first.items():
            node = by_name.get(name)
            gpus = {gpu.get("index"): gpu for gpu in (node.gpus or []) if isinstance(gpu, dict)} if node else {}
            if not gpus:
                raise invalid(f"{where}.kind: a gpu_memory fault holds a GPU's memory, and node {name!r} has no GPU "
                              "(its agent's NVML discovery found none)", field=f"{where}.kind")
            chosen = fault["gpu"] if "gpu" in fault else gpu_index.get(worker) or 0
            if chosen not in gpus:
                field = f"{where}.gpu" if "gpu" in fault else f"{where}.kind"
                raise invalid(f"{field}: node {name!r} has no GPU {chosen}; its GPUs: "
                              f"{', '.join(str(i) for i in sorted(gpus))}", field=field)
            total = gpus[chosen].get("memory_total_bytes")
            if is_number(total) and fault["mib"] * 1024 * 1024 > total:
                raise invalid(f"{where}.mib: {fault['mib']:g} MiB is more than GPU {chosen} of node {name!r} has "
                              f"({int(total) // (1024 * 1024)} MiB, {gpus[chosen].get('name', 'unknown')})",
                              field=f"{where}.mib")


def validate_real_hosts(faults: list[dict], nodes) -> None:
    """At run start: a resource fault (RESOURCE_KINDS) loads the target node's real host, which every node of a
    simulated fleet (label simulated=true) shares with the others and with their simulated worker host: 400."""
    simulated = sorted(node.name for node in nodes if node.all_labels.get("simulated") == "true")
    for index, fault in enumerate(faults):
        if fault["kind"] in RESOURCE_KINDS and simulated:
            raise invalid(f"faults[{index}].kind: a {fault['kind']} fault loads a real host; node "
                          f"{simulated[0]!r} is simulated (many simulated nodes share one host), so only process "
                          f"and network faults run there", field=f"faults[{index}].kind")


def broker_freeze_carrier(faults: list[dict], nodes) -> Node | None:
    """At run start: the node whose agent carries out the experiment's broker_freeze (None: it has none), one on the
    broker's host: for a filesystem broker or one at a local address, this (the web server's) host; else the host
    the broker URL names, by node address or hostname. The target workers' nodes first, then any online node. 400
    naming the fault when no online node's agent can reach the broker's process."""
    where = broker_here()
    local = where["scheme"] == "filesystem" or where.get("host") in LOCAL_HOSTS
    broker = (f"a filesystem broker ({where['folder']}) on {socket.gethostname()}" if where["scheme"] == "filesystem"
              else f"the {where['scheme']} broker at {where.get('host')}:{where.get('port', '?')}")
    return _carrier(faults, nodes, kind="broker_freeze", host=None if local else where.get("host"),
                    what=(broker, "the broker's host"))


def db_slow_carrier(faults: list[dict], nodes) -> Node | None:
    """At run start: the node whose agent carries out the experiment's db_slow (None: it has none), one on the
    database's host, chosen as broker_freeze_carrier chooses (an SQLite file is on this host). 400 naming the fault
    for a database that is neither PostgreSQL nor SQLite, or when no online node is on its host."""
    where = database_here()
    index = next((i for i, fault in enumerate(faults) if fault["kind"] == "db_slow"), None)
    if index is not None and where["database"] not in ("sqlite", "postgresql"):
        raise invalid(f"faults[{index}].kind: a db_slow slows a PostgreSQL or SQLite database, not "
                      f"{where['database']}", field=f"faults[{index}].kind")
    if index is not None and where["database"] == "sqlite" and faults[index]["ms"] > SQLITE_MAX_MS:
        raise invalid(f"faults[{index}].ms: on SQLite a db_slow holds the write lock at most {SQLITE_MAX_MS} ms of "
                      "every 100 ms: writers poll a lock held longer too rarely, and starve past their busy timeout",
                      field=f"faults[{index}].ms")
    local = where["database"] == "sqlite" or where.get("host") in LOCAL_HOSTS
    database = (f"the SQLite database {where.get('path')} on {socket.gethostname()}" if where["database"] == "sqlite"
                else f"the PostgreSQL database at {where.get('host')}:{where.get('port')}")
    return _carrier(faults, nodes, kind="db_slow", host=None if local else where.get("host"),
                    what=(database, "the database's host"))


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _carrier(faults: list[dict], nodes, *, kind: str, host: str | None, what: tuple[str, str]) -> Node | None:
    """The online node on `host` (None: this, the web server's, host) whose agent carries out the experiment's
    fault of `kind`: the target workers' nodes first. 400 naming the fault when there is none."""
    index = next((i for i, fault in enumerate(faults) if fault["kind"] == kind), None)
    if index is None:
        return None
    hosts = {socket.gethostname()} if host is None else {host}  # as node_register records it
    since = timezone.now() - timedelta(seconds=settings.TANDEM_NODE_OFFLINE_AFTER_S)
    online = list(Node.objects.filter(last_seen_at__gte=since).order_by("name"))
    first = {node.pk for node in nodes}
    for node in sorted(online, key=lambda node: node.pk not in first):
        if node.hostname in hosts or (host is not None and node.address in hosts):
            return node
    seen = ", ".join(f"{node.name} ({node.hostname or node.address})" for node in online[:5]) or "none"
    raise invalid(f"faults[{index}].kind: a {kind} is carried out by a node agent on {what[1]}, and {what[0]} has "
                  f"none online (online nodes: {seen})", field=f"faults[{index}].kind")


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
        extra["window_s"] = _number(item.get("window_s", default_window), field=f"{where}.window_s", low=1,
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
        _unknown(check, ("metric", "role", *_CHECK_BOUNDS, "window_s", "aggregation"), where)
        metric, role = _metric(check, where, roles)
        bounds = [key for key in _CHECK_BOUNDS if key in check]
        if len(bounds) != 1:
            raise invalid(f"{where} needs exactly one of {', '.join(_CHECK_BOUNDS)}", field=f"{where}.max")
        bound = bounds[0]
        if bound == "max_baseline_ratio":
            if metric in (READY_WORKERS, "requests"):
                raise invalid(f"{where}.max_baseline_ratio is for rates, ratios and latencies, not {metric}",
                              field=f"{where}.max_baseline_ratio")
            value = _number(check[bound], field=f"{where}.{bound}", low=1, high=1000)
        else:
            value = _number(check[bound], field=f"{where}.{bound}", low=0, high=1e12)
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
        _unknown(condition, ("metric", "role", *_ABORT_BOUNDS, "window_s", "for_s", "aggregation"), where)
        metric, role = _metric(condition, where, roles)
        bounds = [key for key in _ABORT_BOUNDS if key in condition]
        if len(bounds) != 1:
            raise invalid(f"{where} needs exactly one of above, below", field=f"{where}.above")
        cleaned.append({"metric": metric, "role": role,
                        bounds[0]: _number(condition[bounds[0]], field=f"{where}.{bounds[0]}", low=0, high=1e12),
                        "for_s": _number(condition.get("for_s", 0), field=f"{where}.for_s", low=0, high=3600),
                        **_windowed(condition, where, metric, DEFAULT_ABORT_WINDOW_S)})
    return cleaned


def validate_recovery_timeout(value) -> float:
    return _number(value, field="recovery_timeout_s", low=1, high=3600)
