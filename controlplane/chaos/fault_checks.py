"""Checks of an experiment's faults, read from the node agent's registry of fault kinds (controlplane.agent.
fault_kinds: each kind's parameters, limits and own checks): when the experiment is written (validate_faults), and
at run start against the target nodes (memory, GPUs, a simulated host) and the broker's or the database's host (the
carrier of a broker_freeze or a db_slow). Each 400 names its field ("faults[1].mib")."""
from __future__ import annotations

import socket
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.agent.control_faults import SQLITE_MAX_MS, broker_here, database_here
from controlplane.agent.fault_kinds import KINDS, OPTIONAL, REQUIRED, Family, kinds_of
from controlplane.agent.resource_faults import MEMORY_FRACTION
from controlplane.chaos.validation import number, unknown_fields
from controlplane.errors import invalid
from controlplane.models import Node, Worker, WorkerRole
from controlplane.services.validation import each_object
from inference.checks import is_number

MAX_FAULTS = 10
GPU_KIND = "gpu_memory"


def fault_params(fault: dict) -> dict:
    """A validated fault's own settings (what the agent passes to its carrier)."""
    return {key: fault[key] for key in KINDS[fault["kind"]].params if key in fault}


def validate_faults(faults, duration_s: float, role: str | None = None) -> list[dict]:
    """The faults, each with its settings; `role`, the target's (None: a node target's workers of any role): a KV
    fault needs decode workers."""
    if not isinstance(faults, list) or not 1 <= len(faults) <= MAX_FAULTS:
        raise invalid(f"faults must be a list of 1 to {MAX_FAULTS} faults", field="faults")
    cleaned = []
    for where, fault in each_object(faults, field="faults"):
        kind = KINDS.get(fault.get("kind"))
        if kind is None:
            raise invalid(f"{where}.kind {fault.get('kind')!r} is not a fault this version carries out; known: "
                          f"{', '.join(KINDS)}", field=f"{where}.kind")
        unknown_fields(fault, ("kind", *(() if kind.instant else ("duration_s",)), *kind.params), where)
        if kind.on_kv and role != WorkerRole.DECODE:
            raise invalid(f"{where}.kind {kind.name} faults the KV push from prefill to decode workers: target.role "
                          f"must be decode, not {role!r}" + (" (a node target takes one to narrow it)" if role is None
                                                            else ""), field=f"{where}.kind")
        item = {"kind": kind.name}
        if "duration_s" in fault:  # else the experiment's duration, whatever it is changed to
            item["duration_s"] = number(fault["duration_s"], field=f"{where}.duration_s", low=1, high=duration_s)
        for key, param in kind.params.items():
            high, default = (getattr(settings, v) if isinstance(v, str) else v for v in (param.high, param.default))
            if key not in fault and default is REQUIRED:
                raise invalid(f"{where}.{key} is required for a {kind.name} fault", field=f"{where}.{key}")
            if key not in fault and default is OPTIONAL:
                continue
            item[key] = number(fault.get(key, default), field=f"{where}.{key}", low=param.low, high=high,
                               integer=param.integer)
        refused = kind.check(item, item.get("duration_s", duration_s)) if kind.check else None
        if refused is not None:
            raise invalid(f"{where}.{refused[0]}: {refused[1]}", field=f"{where}.{refused[0]}")
        cleaned.append(item)
    proxy_kinds = kinds_of(Family.PROXY)
    proxied = [index for index, fault in enumerate(cleaned) if fault["kind"] in proxy_kinds]
    if len(proxied) > 1:
        # Each would put a fault proxy in front of the same workers, and undoing one would cut the other's path.
        raise invalid(f"faults[{proxied[1]}]: an experiment takes one of {', '.join(proxy_kinds)} (a fault proxy "
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
    """At run start: a resource fault (Family.RESOURCE) loads the target node's real host, which every node of a
    simulated fleet (label simulated=true) shares with the others and with their simulated worker host: 400."""
    simulated = sorted(node.name for node in nodes if node.all_labels.get("simulated") == "true")
    for index, fault in enumerate(faults):
        if KINDS[fault["kind"]].family == Family.RESOURCE and simulated:
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
