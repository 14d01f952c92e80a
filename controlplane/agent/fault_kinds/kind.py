"""What a fault kind is: its family (who carries it out, and how it is held), its parameters with their limits, and
the agent functions that inject and undo it. Pure: the declarations are in the package's __init__."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

REQUIRED = object()  # a Param's default: the fault needs it
OPTIONAL = object()  # a Param's default: left out of the fault when not given


class Family(StrEnum):
    PROCESS = "process"  # a signal to the worker's process group (faults.py)
    PROXY = "proxy"  # a fault proxy in front of the worker (proxy_faults.py)
    RESOURCE = "resource"  # a load on the worker's real host (resource_faults.py)
    CONTROL = "control"  # the broker, the database, or the node agent itself (control_faults.py)


@dataclass(frozen=True, slots=True)
class Param:
    """One setting of a fault beyond `kind` and `duration_s`. A bound or default named by a string is that
    Django setting's value, read when the fault is validated."""
    low: float
    high: float | str
    default: object = REQUIRED
    integer: bool = False


# check(fault, lasts_s) -> (field, message) when a validated fault cannot be carried out as asked, else None.
Check = Callable[[dict, float], "tuple[str, str] | None"]


@dataclass(frozen=True, slots=True)
class FaultKind:
    """One fault kind, declared once.

    start(*, key, kind, worker, until, params) -> (state, handle): injects a fault held until its deadline; `state`
    is what `stop` needs (stored on the injected row, so that a restarted agent can undo it), `handle` the process
    that carries it (None: a file, a thread). stop(*, key, worker_id, state) -> the revert's outcome. A kind without
    `start` is carried out by faults.py itself (a signal to the worker, or to this agent)."""
    name: str
    family: Family
    outcome: str  # the injected row's outcome
    params: dict[str, Param] = field(default_factory=dict)
    start: Callable | None = None
    stop: Callable | None = None
    instant: bool = False  # over at once: takes no duration_s (a kill)
    node_level: bool = False  # once per node of the targets, not once per target worker
    out_of_service: bool = False  # the target leaves the ready workers at once (it exits)
    on_kv: bool = False  # on the prefill -> decode KV push: the target must be decode workers
    proxy_flags: Callable[[dict], list[str]] | None = None  # a proxy fault's flags of the fault proxy
    check: Check | None = None

    @property
    def held(self) -> bool:
        """Held until a deadline by the agent's timer (faults.release)."""
        return not self.instant
