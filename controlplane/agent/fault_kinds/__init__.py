"""Every fault kind the node agent carries out, declared once: its parameters with their limits, the checks the
chaos app makes of them (controlplane.chaos.fault_checks reads this registry), and the agent functions that inject
and undo it. faults.py dispatches on the declaration; a new kind of an existing family is a declaration here, its
carrier (the fault proxy's behaviour, a hog, a control fault) and its test."""
from __future__ import annotations

from controlplane.agent import control_faults, proxy_faults, resource_faults
from controlplane.agent.fault_kinds.kind import OPTIONAL, REQUIRED, Family, FaultKind, Param

__all__ = ["KINDS", "Family", "FaultKind", "OPTIONAL", "Param", "REQUIRED", "kinds_of"]

RATIO = Param(0.01, 1, 1.0)  # the fraction of generation requests (or KV pushes) faulted
MS = Param(1, 60_000)  # a delay, required


def _latency_flags(params: dict) -> list[str]:
    flags = ["--latency-ms", str(params.get("ms", 0))]
    return flags + (["--line-latency-ms", str(params["line_ms"])] if params.get("line_ms") else [])


def _partition_onset(fault: dict, lasts_s: float) -> tuple[str, str] | None:
    if fault["onset_s"] >= lasts_s:
        return "onset_s", (f"the partition would begin {fault['onset_s']:g} s in, when the fault's {lasts_s:g} s are "
                           "over; give a shorter onset_s (default 5) or a longer duration_s")
    return None


def _proxy(name: str, params: dict[str, Param], flags, **extra) -> FaultKind:
    return FaultKind(name, Family.PROXY, "proxied", params, start=proxy_faults.proxy_start,
                     stop=proxy_faults.proxy_stop, proxy_flags=flags, **extra)


def _resource(name: str, params: dict[str, Param], outcome: str = "hogging") -> FaultKind:
    return FaultKind(name, Family.RESOURCE, outcome, params, start=resource_faults.resource_start,
                     stop=resource_faults.resource_stop, node_level=True)


def _held_control(name: str, params: dict[str, Param], outcome: str) -> FaultKind:
    return FaultKind(name, Family.CONTROL, outcome, params, start=control_faults.freeze_start,
                     stop=control_faults.freeze_stop)


_DECLARED = (
    # SIGKILL the worker's process group; supervision restarts it. SIGSTOP it, SIGCONT at the deadline.
    FaultKind("kill", Family.PROCESS, "killed", instant=True, out_of_service=True),
    FaultKind("pause", Family.PROCESS, "paused"),
    # The fault proxy in front of the worker's port: a fraction answered 500, a delay before each request and
    # each streamed line, a fraction whose connection is cut.
    _proxy("error", {"ratio": RATIO}, lambda p: ["--error-ratio", str(p.get("ratio", 1.0))]),
    _proxy("latency", {"ms": MS, "line_ms": Param(0, 10_000, 0)}, _latency_flags),
    _proxy("reset", {"ratio": RATIO}, lambda p: ["--reset-ratio", str(p.get("ratio", 1.0))]),
    # Every connection held unanswered, health checks included, from `onset_s` after the proxy takes the worker's
    # place (gateways poll the membership every 2 s by default: then it cuts requests in flight too).
    _proxy("partition", {"onset_s": Param(0, 60, 5)},
           lambda p: ["--partition", "--partition-after-s", str(p.get("onset_s", 0))], check=_partition_onset),
    # On the prefill -> decode KV push only (a decode worker's KV address): a delay, a cut, bytes flipped.
    _proxy("kv_latency", {"ms": MS}, _latency_flags, on_kv=True),
    _proxy("kv_reset", {"ratio": RATIO}, lambda p: ["--reset-ratio", str(p.get("ratio", 1.0))], on_kv=True),
    _proxy("kv_corrupt", {"ratio": RATIO, "bytes": Param(1, 1024, 1, integer=True)},
           lambda p: ["--corrupt-ratio", str(p.get("ratio", 1.0)), "--corrupt-bytes", str(int(p.get("bytes", 1)))],
           on_kv=True),
    # Busy processes; MiB allocated and touched (at most resource_faults.MEMORY_FRACTION of what the host has).
    _resource("cpu_hog", {"workers": Param(1, 256, 1, integer=True)}),
    _resource("memory_pressure", {"mib": Param(1, 1 << 20, integer=True)}),
    # MiB allocated and written on one GPU of the host: `gpu` (a Node.gpus index), else the target worker's, else 0.
    _resource("gpu_memory", {"mib": Param(1, 1 << 20, integer=True), "gpu": Param(0, 255, OPTIONAL, integer=True)}),
    # One file under the host's var/ folder, as large as leaves free_mib MiB free there, but at most max_mib MiB.
    _resource("disk_fill", {"free_mib": Param(0, 1 << 20, 64, integer=True),
                            "max_mib": Param(1, "TANDEM_CHAOS_DISK_FILL_MAX_MIB", "TANDEM_CHAOS_DISK_FILL_MAX_MIB",
                                             integer=True)}, outcome="filled"),
    # The Celery broker hangs for the duration (by an agent on the broker's host: fault_checks.broker_freeze_carrier);
    # the target's deployment is the one whose clients the hypothesis reads.
    _held_control("broker_freeze", {}, "frozen"),
    # SIGKILL the node agent of the target worker's host; its supervisor starts it again.
    FaultKind("agent_kill", Family.CONTROL, "killed", instant=True, node_level=True),
    # Every statement of the control plane's database slowed: its server stopped (SQLite: its write lock held) `ms`
    # out of every 100 ms, by an agent on the database's host (fault_checks.db_slow_carrier).
    _held_control("db_slow", {"ms": Param(1, 90, 50)}, "throttled"),
)
KINDS: dict[str, FaultKind] = {kind.name: kind for kind in _DECLARED}


def kinds_of(family: Family | None = None, **flags: bool) -> tuple[str, ...]:
    """The names of the kinds of a family, or with the given flags (`kinds_of(on_kv=True)`), in declared order."""
    return tuple(name for name, kind in KINDS.items() if (family is None or kind.family == family)
                 and all(getattr(kind, flag) == value for flag, value in flags.items()))
