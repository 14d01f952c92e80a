"""The faults a node agent holds until their deadline, and the audit rows of every fault it injects or reverts.

A pause, a proxy or resource fault and a broker freeze each end at a deadline this agent process keeps (a timer per
fault key, faults.release); a kill or a proxy needs no more than its rows. What a paused worker's stop does to its
pause (pause_superseded) lives here, so that the worker lifecycle (workers.py) reaches it without the fault kinds.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError

from controlplane.agent import processes, runtime
from controlplane.models import ActionKind, ActionStatus, Worker
from controlplane.services.actions import Actor, DuplicateAction, action_create

log = logging.getLogger(__name__)

# The audit rows of a fault, its injection and its revert alike: params.event (fault_injected, fault_reverted) says
# which.
FAULT_KIND = ActionKind.FAULT


def injected_key(key: str) -> str:
    return f"{key}:injected"


def reverted_key(key: str) -> str:
    return f"{key}:reverted"


@dataclass(slots=True)
class HeldFault:
    handle: processes.ProcessHandle | None  # the worker's (pause), the fault proxy's or the hog's process
    timer: threading.Timer
    until: float
    worker_id: int
    audit: dict
    kind: str = "pause"  # the fault's kind (fault_kinds.KINDS)
    state: dict | None = None  # what the kind's stop needs (None: a pause, released by SIGCONT)


# Faults with a deadline this process holds (pauses, proxy and resource faults, a broker freeze), by fault key: the
# timer that releases each one at its deadline.
held: dict[str, HeldFault] = {}
starting: set[str] = set()  # proxy and resource faults whose process is starting (outside the lock: it takes a while)
held_lock = threading.Lock()


def paused_keys() -> list[str]:
    with held_lock:
        return sorted(held)


def is_held(key: str) -> bool:
    with held_lock:
        return key in held


def _actor() -> Actor:
    return Actor.system(f"node agent {runtime.node_name or settings.TANDEM_NODE_NAME}")


def record(*, kind: str, key: str, worker: Worker | None, event: str, audit: dict, outcome: str,
            status: str = ActionStatus.SUCCEEDED, error: str = "", **result) -> None:
    """One audit row of what this agent did; a database that refuses it is logged, never raised (the signal was
    sent or not, whatever the row says)."""
    try:
        action_create(
            kind=kind, actor=_actor(), deployment=worker.deployment if worker else None, worker=worker,
            reason=f"{event.replace('_', ' ')}: {outcome}" + (f" ({error})" if error else ""), status=status,
            idempotency_key=key, params={**audit, "event": event, "worker": worker.id if worker else None},
            result={"outcome": outcome, **({"error": error} if error else {}), **result})
    except DuplicateAction:
        pass
    except DatabaseError as exc:
        log.warning("fault %s: the audit row (%s) was not written: %r", key, event, exc)


def worker_of(worker_id: int) -> Worker | None:
    return Worker.objects.select_related("deployment", "node").filter(id=worker_id).first()


def pause_superseded(*, worker_id: int, by: str) -> str | None:
    """A paused worker is being stopped (a restart after failed health checks, a scale-down): its pause ends now,
    with one revert row saying so, instead of a SIGCONT at the deadline to a process already replaced (the audit
    showed it resumed and restarted in the same second). SIGCONT first, so that the stop's SIGTERM is handled
    (a drain) rather than waiting for the SIGKILL. Returns the fault key, or None when no pause holds the worker."""
    with held_lock:
        key = next((k for k, p in held.items() if p.worker_id == worker_id and p.state is None), None)
        if key is None:
            return None
        pause = held.pop(key)
        pause.timer.cancel()
        runtime.launcher.signal_group(pause.handle, signal.SIGCONT)
    log.info("fault %s (worker %s): its pause ends with %s", key, worker_id, by)
    record(kind=FAULT_KIND, key=reverted_key(key), worker=worker_of(worker_id), event="fault_reverted",
           audit=pause.audit, outcome="superseded", by=by, pid=pause.handle.pid if pause.handle else None,
           late_s=round(max(0.0, time.time() - pause.until), 3))
    return key
