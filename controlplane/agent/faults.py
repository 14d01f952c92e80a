"""Faults on this host, carried out by the node agent, which owns the worker processes: `kill` (SIGKILL the worker's
process group), `pause` (SIGSTOP it, SIGCONT at its deadline), the proxy faults `error`, `latency`, `reset` and
`partition`, and the KV-push faults `kv_latency`, `kv_reset` and `kv_corrupt` (a fault proxy in front of the worker,
which the worker's row, or its KV address, points at until the deadline: proxy_faults.py), and the
resource faults `cpu_hog`, `memory_pressure` (a hog on the worker's host until the deadline) and `disk_fill` (a file
under the host's var/ folder until the deadline): resource_faults.py,
and the control faults `broker_freeze` (the Celery broker hangs until the deadline), `db_slow` (the database throttled
until then) and `agent_kill` (this agent SIGKILLs itself; its supervisor starts it again): control_faults.py.

Each kind is declared once in fault_kinds/ (its parameters and limits, the functions that start and stop it); this
module dispatches on the declaration and holds the deadlines.

The agent is the executor, never the policy: a fault arrives as a message naming the worker, the kind, a deadline
(`until`, Unix seconds) and the audit params to copy onto its rows; what happened is reported as Action rows
(services.actions), one when the fault is injected and one when it is reverted, each under an idempotency key derived
from the fault's `key`. Whoever asked (the chaos app) reads those rows: a message delivered twice injects once.

A pause's, a proxy fault's or a resource fault's deadline is enforced here, by a timer in the agent process: the
worker is released (the row points at the worker again) at `until` even when the broker, the control worker or the
database is gone by then; a fault proxy also stops faulting at `until` by itself, and a hog exits then, even without
its agent (a fill file has no deadline of its own: a restarted agent takes it over from its injected row). A revert
message releases it earlier. A revert for a fault this process does not know (the agent restarted meanwhile) still
sends SIGCONT to the worker's recorded process (harmless for a process that runs), or stops the proxy or the hog, or
deletes the fill file, that the injected row names.

In a simulated fleet the worker's "process" lives in a simulated worker host and is signalled through it
(runtime.launcher.signal_group: a kill closes it with exit code -9, a pause holds every request to it and its engine);
the proxy faults are the same real fault proxy in front of its real port. The resource faults load the real host,
which many simulated nodes share: they are refused there ("unsupported"; the chaos app refuses them first, 400).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

from django.conf import settings
from django.db import DatabaseError

from controlplane.agent import control_faults, launch, processes, proxy_faults, resource_faults, runtime
from controlplane.agent.fault_kinds import KINDS, Family, FaultKind
from controlplane.agent.fault_holds import (FAULT_KIND, HeldFault, held, held_lock,
                                            injected_key, record, reverted_key, starting, worker_of)
from controlplane.models import ActionStatus, Worker
from controlplane.services.actions import action_find

log = logging.getLogger(__name__)

AGENT_FAULT_INJECT = "controlplane.agent.tasks.agent_fault_inject"
AGENT_FAULT_REVERT = "controlplane.agent.tasks.agent_fault_revert"


def _live_handle(worker: Worker | None) -> processes.ProcessHandle | None:
    """The worker's process when it lives on this host; never a pid of another node's worker (a routing bug must
    not signal whatever process has that number here)."""
    if worker is None:
        return None
    if runtime.node_name is not None and (worker.node is None or worker.node.name != runtime.node_name):
        log.error("a fault for worker %s of node %r reached the agent of %r: ignored", worker.id,
                  worker.node and worker.node.name, runtime.node_name)
        return None
    handle = launch.handle_of(worker)
    return handle if handle is not None and runtime.launcher.is_alive(handle) else None


def fault_inject(*, key: str, kind: str, worker_id: int, until: float, audit: dict | None = None,
                 params: dict | None = None) -> str:
    """Inject one fault into one worker's process (a resource fault: its host; agent_kill: its node's agent;
    broker_freeze, db_slow: the broker, the database). Returns the outcome: "killed", "paused", "proxied", "hogging",
    "filled", "frozen", "throttled", "duplicate" (this key was injected before), "cancelled" (its revert came first),
    "expired" (the deadline passed before the message arrived), "gone" (no live process), "failed" (the proxy or the
    hog did not start, more memory than the host has, a fill file not written) or "unsupported".

    1. A key already injected (its row exists) is not injected again: a re-delivered message is a no-op; a key
       already reverted is not injected at all.
    2. pause: SIGSTOP the process group and arm the release timer for min(until, now + the maximum duration).
    3. error, latency, reset, partition, kv_*: start the fault proxy (its own deadline the same), point the row
       (or its KV address) at it, arm the timer.
    4. cpu_hog, memory_pressure: start the hog on this host (its own deadline the same), arm the timer; disk_fill:
       write the fill file under var/, arm the timer.
    5. broker_freeze: freeze the broker (control_faults), arm the timer. agent_kill: write the row, SIGKILL this agent.
    6. kill: SIGKILL the process group; the node's heartbeat reports the exit and supervision restarts it.
    """
    audit = dict(audit or {})
    spec = KINDS.get(kind)
    if spec is None:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
    if action_find(injected_key(key)) is not None:
        return "duplicate"
    worker = worker_of(worker_id)
    common = dict(kind=FAULT_KIND, key=injected_key(key), worker=worker, event="fault_injected",
                  audit={**audit, "fault": kind})
    if action_find(reverted_key(key)) is not None:
        # Its revert came first (the two messages travel apart, and a short fault's revert can overtake its inject):
        # injected now, the fault would stay until its deadline with no revert left to come.
        record(**common, outcome="cancelled", status=ActionStatus.FAILED,
                error="its revert arrived first: nothing injected")
        return "cancelled"
    if runtime.simulated and spec.family == Family.RESOURCE:
        record(**common, outcome="unsupported", status=ActionStatus.FAILED,
                error="resource faults load the real host, which a simulated fleet's nodes share")
        return "unsupported"
    now = time.time()
    remaining = min(until - now, float(settings.TANDEM_CHAOS_MAX_DURATION_S))
    if spec.held and remaining <= 0:
        record(**common, outcome="expired", status=ActionStatus.FAILED,
                error=f"the fault's deadline passed {now - until:.1f} s before the message arrived")
        return "expired"
    if spec.family == Family.CONTROL:
        return _control_inject(key=key, spec=spec, worker=worker, until=now + remaining, params=params or {},
                               audit=audit, common=common)
    handle = _live_handle(worker)
    if handle is None:
        record(**common, outcome="gone", status=ActionStatus.FAILED, error="the worker has no live process")
        return "gone"
    if kind == "kill":
        runtime.launcher.signal_group(handle, signal.SIGKILL)
        record(**common, outcome="killed", pid=handle.pid, signal="SIGKILL")
        log.info("fault %s: worker %s (pid %d) killed", key, worker_id, handle.pid)
        return "killed"
    if spec.start is not None:
        return _held_inject(key=key, spec=spec, worker=worker, until=now + remaining, params=params or {},
                             audit=audit, common=common)
    with held_lock:
        if key in held:
            return "duplicate"
        timer = threading.Timer(remaining, release, args=(key, "the agent's deadline"))
        timer.daemon = True
        held[key] = HeldFault(handle=handle, timer=timer, until=now + remaining, worker_id=worker_id,
                              audit={**audit, "fault": kind}, kind=kind)
        runtime.launcher.signal_group(handle, signal.SIGSTOP)
        timer.start()
    record(**common, outcome="paused", pid=handle.pid, signal="SIGSTOP", until=now + remaining)
    log.info("fault %s: worker %s (pid %d) paused for %.1f s", key, worker_id, handle.pid, remaining)
    return "paused"


def _control_inject(*, key: str, spec: FaultKind, worker: Worker | None, until: float, params: dict, audit: dict,
                    common: dict) -> str:
    """agent_kill or broker_freeze, carried out by a node agent process only (an eager task in the control worker
    would kill or freeze the control plane itself). The node is the worker's (agent_kill) or the carrier's that the
    chaos app chose (params["node"], broker_freeze)."""
    node = params.get("node") or (worker.node.name if worker is not None and worker.node is not None else None)
    refused = None
    if runtime.node_name is None and not runtime.simulated:
        refused = "unsupported", "carried out by a node agent process only; this process is not one"
    elif worker is None:
        refused = "gone", "the target worker has no row"
    elif runtime.node_name is not None and node != runtime.node_name:
        refused = "failed", f"meant for the agent of node {node!r}, not {runtime.node_name!r}"
    if refused is not None:
        record(**common, outcome=refused[0], status=ActionStatus.FAILED, error=refused[1])
        return refused[0]
    if spec.start is not None:
        return _held_inject(key=key, spec=spec, worker=worker, until=until, params={**params, "node": node},
                            audit=audit, common=common)
    # The row first: once this agent is gone, nobody could write it; a message delivered again finds it.
    record(**common, outcome="killed", node=node, agent_pid=os.getpid(), signal="SIGKILL",
            simulated=runtime.simulated)
    control_faults.agent_kill(node)
    return "killed"


def _held_inject(*, key: str, spec: FaultKind, worker: Worker, until: float, params: dict, audit: dict,
                 common: dict) -> str:
    """A fault with a process of its own (a fault proxy, a hog), a file or a freeze, held until its deadline: its
    declaration's start, then the timer."""
    with held_lock:
        if key in held or key in starting:
            return "duplicate"
        starting.add(key)
    try:
        state, handle = spec.start(key=key, kind=spec, worker=worker, until=until, params=params)
    except (proxy_faults.ProxyFailed, resource_faults.ResourceRefused, control_faults.FreezeFailed) as exc:
        record(**common, outcome="failed", status=ActionStatus.FAILED, error=str(exc))
        return "failed"
    finally:
        with held_lock:
            starting.discard(key)
    hold(key, handle=handle, until=until, worker_id=worker.id, audit={**audit, "fault": spec.name}, kind=spec.name,
         state=state)
    record(**common, outcome=spec.outcome, until=until, params=params, **state)
    log.info("fault %s: %s, %s %s (worker %s) until %.1f", key, spec.outcome, spec.name, params, worker.id, until)
    return spec.outcome


def hold(key: str, *, until: float, **fields) -> None:
    """Hold a fault with a state of its own (a process, a file, a freeze) until `until`: the timer that releases
    it."""
    timer = threading.Timer(max(0.0, until - time.time()), release, args=(key, "the agent's deadline"))
    timer.daemon = True
    with held_lock:
        held[key] = HeldFault(timer=timer, until=until, **fields)
        timer.start()


def release(key: str, by: str) -> str | None:
    """Undo a fault this process holds (at its deadline, or on a revert): SIGCONT a pause, point the row back and
    stop the proxy, stop the hog or delete the fill file. None when it holds no such fault."""
    with held_lock:
        pause = held.pop(key, None)
        if pause is None:
            return None
        pause.timer.cancel()
        if pause.state is None:
            outcome = "resumed" if runtime.launcher.signal_group(pause.handle, signal.SIGCONT) else "gone"
    if pause.state is not None:
        outcome = _stop(key, KINDS[pause.kind], pause.worker_id, pause.state)
    log.info("fault %s (worker %s) released by %s: %s", key, pause.worker_id, by, outcome)
    try:
        worker = worker_of(pause.worker_id)
    except DatabaseError:
        worker = None
    record(kind=FAULT_KIND, key=reverted_key(key), worker=worker, event="fault_reverted", audit=pause.audit,
            outcome=outcome, by=by, pid=pause.handle.pid if pause.handle else None,
            late_s=round(max(0.0, time.time() - pause.until), 3))
    return outcome


def _stop(key: str, spec: FaultKind, worker_id: int, state: dict) -> str:
    """Undo a held fault by its declaration's stop."""
    try:
        return spec.stop(key=key, worker_id=worker_id, state=state)
    except DatabaseError as exc:
        # The proxy passes through past its deadline: the worker is reachable; a later revert retries the row.
        log.warning("fault %s: the worker's row was not pointed back: %r", key, exc)
        return "failed"


def _wait_started(key: str) -> None:
    """A revert that arrives while the fault's proxy or hog is still starting (the inject and the revert run on
    two threads of the agent; a short fault's revert can overtake its start) waits for the start to end: else it
    finds nothing to undo, reports "gone", and the fault stays until its deadline."""
    deadline = time.monotonic() + proxy_faults.LISTEN_TIMEOUT_S + 5.0
    while time.monotonic() < deadline:
        with held_lock:
            if key not in starting:
                return
        time.sleep(0.05)


def fault_revert(*, key: str, kind: str, worker_id: int, audit: dict | None = None) -> str:
    """Undo one fault. Returns "resumed", "restored", "stopped" (a hog), "removed" (a fill file), "thawed" (a broker),
    "released" (a database), "restarted" (an agent killed, back), "already-reverted", "nothing-to-revert" (a kill,
    which supervision restarts), "agent-down" (a simulated agent killed, not back: its restart writes it) or "gone".

    A fault this process holds is released now (its timer cancelled). A pause it does not hold (the agent restarted,
    or the deadline released it) gets SIGCONT on the worker's recorded process unless its revert row exists; a proxy
    or resource fault it does not hold is undone from what its injected row recorded."""
    audit = {**(audit or {}), "fault": kind}
    _wait_started(key)
    outcome = release(key, "a revert")
    if outcome is not None:
        return outcome
    if action_find(reverted_key(key)) is not None:
        return "already-reverted"
    worker = worker_of(worker_id)
    spec = KINDS[kind]
    if kind == "kill":
        outcome = "nothing-to-revert"
    elif spec.stop is not None:
        injected = action_find(injected_key(key))
        state = (injected.result or {}) if injected is not None else {}
        outcome = _stop(key, spec, worker_id, state) if state else "gone"
    elif kind == "agent_kill":
        node = worker.node.name if worker is not None and worker.node is not None else None
        if node is not None and control_faults.agent_is_down(node):
            return "agent-down"
        outcome = "restarted"  # this message reached the node's agent: a live one, started again
    else:
        handle = _live_handle(worker)
        outcome = "resumed" if handle is not None and runtime.launcher.signal_group(handle, signal.SIGCONT) \
            else "gone"
    record(kind=FAULT_KIND, key=reverted_key(key), worker=worker, event="fault_reverted", audit=audit,
            outcome=outcome, by="a revert")
    return outcome

