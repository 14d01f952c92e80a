"""Faults on this host, carried out by the node agent, which owns the worker processes: `kill` (SIGKILL the worker's
process group), `pause` (SIGSTOP it, SIGCONT at its deadline), the proxy faults `error`, `latency`, `reset` and
`partition`, and the KV-push faults `kv_latency`, `kv_reset` and `kv_corrupt` (a fault proxy in front of the worker,
which the worker's row, or its KV address, points at until the deadline: proxy_faults.py), and the
resource faults `cpu_hog`, `memory_pressure` (a hog on the worker's host until the deadline) and `disk_fill` (a file
under the host's var/ folder until the deadline): resource_faults.py,
and the control faults `broker_freeze` (the Celery broker hangs until the deadline), `db_slow` (the database throttled
until then) and `agent_kill` (this agent SIGKILLs itself; its supervisor starts it again): control_faults.py.

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
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from controlplane.agent import control_faults, launch, processes, proxy_faults, resource_faults, runtime
from controlplane.models import Action, ActionKind, ActionStatus, Worker
from controlplane.services.actions import Actor, DuplicateAction, action_create, action_find

log = logging.getLogger(__name__)

AGENT_FAULT_INJECT = "controlplane.agent.tasks.agent_fault_inject"
AGENT_FAULT_REVERT = "controlplane.agent.tasks.agent_fault_revert"
FAULT_KINDS = ("kill", "pause", *proxy_faults.PROXY_KINDS, *resource_faults.RESOURCE_KINDS,
               *control_faults.CONTROL_KINDS)
# The audit rows of a fault. ActionKind has no `fault` value: adding one changes the Action.kind field's choices,
# which needs a migration of the core app (see docs/chaos.md); `start`/`stop` carry params.event instead.
INJECTED_KIND, REVERTED_KIND = ActionKind.START, ActionKind.STOP


def injected_key(key: str) -> str:
    return f"{key}:injected"


def reverted_key(key: str) -> str:
    return f"{key}:reverted"


@dataclass(slots=True)
class _Pause:
    handle: processes.ProcessHandle | None  # the worker's (pause), the fault proxy's or the hog's process
    timer: threading.Timer
    until: float
    worker_id: int
    audit: dict
    proxy: dict | None = None  # a proxy fault: what proxy_faults.proxy_stop needs
    resource: dict | None = None  # a resource fault: what resource_faults.resource_stop needs
    freeze: dict | None = None  # a broker freeze: what control_faults.freeze_stop needs


# Faults with a deadline this process holds (pauses, proxy and resource faults, a broker freeze), by fault key: the
# timer that releases each one at its deadline.
_paused: dict[str, _Pause] = {}
_starting: set[str] = set()  # proxy and resource faults whose process is starting (outside the lock: it takes a while)
_paused_lock = threading.Lock()


def paused_keys() -> list[str]:
    with _paused_lock:
        return sorted(_paused)


def _actor() -> Actor:
    return Actor.system(f"node agent {runtime.node_name or settings.TANDEM_NODE_NAME}")


def _record(*, kind: str, key: str, worker: Worker | None, event: str, audit: dict, outcome: str,
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


def _worker(worker_id: int) -> Worker | None:
    return Worker.objects.select_related("deployment", "node").filter(id=worker_id).first()


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
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
    if action_find(injected_key(key)) is not None:
        return "duplicate"
    worker = _worker(worker_id)
    common = dict(kind=INJECTED_KIND, key=injected_key(key), worker=worker, event="fault_injected",
                  audit={**audit, "fault": kind})
    if action_find(reverted_key(key)) is not None:
        # Its revert came first (the two messages travel apart, and a short fault's revert can overtake its inject):
        # injected now, the fault would stay until its deadline with no revert left to come.
        _record(**common, outcome="cancelled", status=ActionStatus.FAILED,
                error="its revert arrived first: nothing injected")
        return "cancelled"
    if runtime.simulated and kind in resource_faults.RESOURCE_KINDS:
        _record(**common, outcome="unsupported", status=ActionStatus.FAILED,
                error="resource faults load the real host, which a simulated fleet's nodes share")
        return "unsupported"
    now = time.time()
    remaining = min(until - now, float(settings.TANDEM_CHAOS_MAX_DURATION_S))
    if kind not in ("kill", "agent_kill") and remaining <= 0:
        _record(**common, outcome="expired", status=ActionStatus.FAILED,
                error=f"the fault's deadline passed {now - until:.1f} s before the message arrived")
        return "expired"
    if kind in control_faults.CONTROL_KINDS:
        return _control_inject(key=key, kind=kind, worker=worker, until=now + remaining, params=params or {},
                               audit=audit, common=common)
    handle = _live_handle(worker)
    if handle is None:
        _record(**common, outcome="gone", status=ActionStatus.FAILED, error="the worker has no live process")
        return "gone"
    if kind == "kill":
        runtime.launcher.signal_group(handle, signal.SIGKILL)
        _record(**common, outcome="killed", pid=handle.pid, signal="SIGKILL")
        log.info("fault %s: worker %s (pid %d) killed", key, worker_id, handle.pid)
        return "killed"
    if kind in proxy_faults.PROXY_KINDS or kind in resource_faults.RESOURCE_KINDS:
        return _held_inject(key=key, kind=kind, worker=worker, until=now + remaining, params=params or {},
                             audit=audit, common=common)
    with _paused_lock:
        if key in _paused:
            return "duplicate"
        timer = threading.Timer(remaining, _release, args=(key, "the agent's deadline"))
        timer.daemon = True
        _paused[key] = _Pause(handle=handle, timer=timer, until=now + remaining, worker_id=worker_id,
                              audit={**audit, "fault": kind})
        runtime.launcher.signal_group(handle, signal.SIGSTOP)
        timer.start()
    _record(**common, outcome="paused", pid=handle.pid, signal="SIGSTOP", until=now + remaining)
    log.info("fault %s: worker %s (pid %d) paused for %.1f s", key, worker_id, handle.pid, remaining)
    return "paused"


def _control_inject(*, key: str, kind: str, worker: Worker | None, until: float, params: dict, audit: dict,
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
        _record(**common, outcome=refused[0], status=ActionStatus.FAILED, error=refused[1])
        return refused[0]
    if kind in control_faults.HELD_KINDS:
        return _held_inject(key=key, kind=kind, worker=worker, until=until, params={**params, "node": node},
                            audit=audit, common=common)
    # The row first: once this agent is gone, nobody could write it; a message delivered again finds it.
    _record(**common, outcome="killed", node=node, agent_pid=os.getpid(), signal="SIGKILL",
            simulated=runtime.simulated)
    control_faults.agent_kill(node)
    return "killed"


def _held_inject(*, key: str, kind: str, worker: Worker, until: float, params: dict, audit: dict,
                 common: dict) -> str:
    """A fault with a process of its own (a fault proxy, a hog) or a broker freeze, held until its deadline."""
    proxied, frozen = kind in proxy_faults.PROXY_KINDS, kind in control_faults.HELD_KINDS
    with _paused_lock:
        if key in _paused or key in _starting:
            return "duplicate"
        _starting.add(key)
    try:
        if proxied:
            state = proxy_faults.proxy_start(key=key, kind=kind, worker=worker, until=until, params=params)
            handle = processes.ProcessHandle(pid=state["proxy_pid"], create_time=state["proxy_started"],
                                             marker=proxy_faults.marker_of(key))
        elif frozen:
            state, handle = {**control_faults.freeze_start(key=key, kind=kind, params=params), **params}, None
        else:
            state, handle = resource_faults.resource_start(key=key, kind=kind, worker_id=worker.id, until=until,
                                                           params=params, node=runtime.node_name)
    except (proxy_faults.ProxyFailed, resource_faults.ResourceRefused, control_faults.FreezeFailed) as exc:
        _record(**common, outcome="failed", status=ActionStatus.FAILED, error=str(exc))
        return "failed"
    finally:
        with _paused_lock:
            _starting.discard(key)
    _hold(key, handle=handle, until=until, worker_id=worker.id, audit={**audit, "fault": kind},
          proxy=state if proxied else None, resource=state if not proxied and not frozen else None,
          freeze=state if frozen else None)
    outcome = "proxied" if proxied else control_faults.HELD_OUTCOMES.get(kind) or \
        ("filled" if kind == "disk_fill" else "hogging")
    _record(**common, outcome=outcome, until=until, params=params, **state)
    log.info("fault %s: %s, %s %s (worker %s) until %.1f", key, outcome, kind, params, worker.id, until)
    return outcome


def _hold(key: str, *, until: float, **fields) -> None:
    """Hold a fault with a process (or a file) of its own until `until`: the timer that releases it."""
    timer = threading.Timer(max(0.0, until - time.time()), _release, args=(key, "the agent's deadline"))
    timer.daemon = True
    with _paused_lock:
        _paused[key] = _Pause(timer=timer, until=until, **fields)
        timer.start()


def _release(key: str, by: str) -> str | None:
    """Undo a fault this process holds (at its deadline, or on a revert): SIGCONT a pause, point the row back and
    stop the proxy, stop the hog or delete the fill file. None when it holds no such fault."""
    with _paused_lock:
        pause = _paused.pop(key, None)
        if pause is None:
            return None
        pause.timer.cancel()
        if pause.proxy is None and pause.resource is None and pause.freeze is None:
            outcome = "resumed" if runtime.launcher.signal_group(pause.handle, signal.SIGCONT) else "gone"
    if pause.proxy is not None:
        outcome = _proxy_stop(key, pause.worker_id, pause.proxy)
    elif pause.resource is not None:
        outcome = resource_faults.resource_stop(key=key, state=pause.resource)
    elif pause.freeze is not None:
        outcome = control_faults.freeze_stop(key=key, state=pause.freeze)
    log.info("fault %s (worker %s) released by %s: %s", key, pause.worker_id, by, outcome)
    try:
        worker = _worker(pause.worker_id)
    except DatabaseError:
        worker = None
    _record(kind=REVERTED_KIND, key=reverted_key(key), worker=worker, event="fault_reverted", audit=pause.audit,
            outcome=outcome, by=by, pid=pause.handle.pid if pause.handle else None,
            late_s=round(max(0.0, time.time() - pause.until), 3))
    return outcome


def _proxy_stop(key: str, worker_id: int, state: dict) -> str:
    try:
        return proxy_faults.proxy_stop(key=key, worker_id=worker_id, state=state)
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
        with _paused_lock:
            if key not in _starting:
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
    outcome = _release(key, "a revert")
    if outcome is not None:
        return outcome
    if action_find(reverted_key(key)) is not None:
        return "already-reverted"
    worker = _worker(worker_id)
    if kind == "kill":
        outcome = "nothing-to-revert"
    elif kind in proxy_faults.PROXY_KINDS:
        injected = action_find(injected_key(key))
        state = (injected.result or {}) if injected is not None else {}
        outcome = _proxy_stop(key, worker_id, state) if "proxy_port" in state else "gone"
    elif kind in resource_faults.RESOURCE_KINDS:
        injected = action_find(injected_key(key))
        state = (injected.result or {}) if injected is not None else {}
        outcome = resource_faults.resource_stop(key=key, state=state)
    elif kind in control_faults.HELD_KINDS:
        injected = action_find(injected_key(key))
        state = (injected.result or {}) if injected is not None else {}
        outcome = control_faults.freeze_stop(key=key, state=state) if state else "gone"
    elif kind == "agent_kill":
        node = worker.node.name if worker is not None and worker.node is not None else None
        if node is not None and control_faults.agent_is_down(node):
            return "agent-down"
        outcome = "restarted"  # this message reached the node's agent: a live one, started again
    else:
        handle = _live_handle(worker)
        outcome = "resumed" if handle is not None and runtime.launcher.signal_group(handle, signal.SIGCONT) \
            else "gone"
    _record(kind=REVERTED_KIND, key=reverted_key(key), worker=worker, event="fault_reverted", audit=audit,
            outcome=outcome, by="a revert")
    return outcome


def faults_resume_after_restart(*, node_name: str, adopted: dict | None = None) -> list[str]:
    """After this node's agent started (again): the control faults its predecessor carried and nobody reverted get
    their revert rows now. An agent_kill is over (this agent is its restart: `restarted`, with the workers adopted);
    a broker freeze is thawed at once (its timer died with the old agent, and no revert can come through a frozen
    broker). A disk_fill's file (which has no deadline of its own) is held again until its deadline, or deleted now
    when that has passed. Returns the keys reverted or held again."""
    since = timezone.now() - timedelta(days=1)
    rows = Action.objects.filter(created_at__gte=since, kind=INJECTED_KIND, status=ActionStatus.SUCCEEDED,
                                 params__event="fault_injected",
                                 params__fault__in=(*control_faults.CONTROL_KINDS, "disk_fill"),
                                 result__node=node_name).select_related("worker", "deployment")
    resumed = []
    for row in rows:
        key = (row.idempotency_key or "").removesuffix(":injected")
        if not key or action_find(reverted_key(key)) is not None:
            continue
        fault = row.params["fault"]
        if fault in control_faults.HELD_KINDS and _release(key, "the agent's restart") is not None:
            resumed.append(key)  # held by this very process (a simulated agent's restart): released, row written
            continue
        audit = {k: v for k, v in (row.params or {}).items() if k not in ("event", "worker")}
        state = row.result or {}
        if fault == "disk_fill":
            with _paused_lock:
                if key in _paused:
                    continue  # held by this very process
            if state.get("until", 0) > time.time():
                _hold(key, handle=None, until=state["until"], worker_id=row.worker_id, audit=audit, resource=state)
                log.info("fault %s (disk_fill) of node %s: held again until %.1f", key, node_name, state["until"])
                resumed.append(key)
                continue
            outcome, extra = resource_faults.fill_remove(key=key, state=state), {}
        elif fault == "agent_kill":
            outcome = "restarted"
            extra = {"adopted": (adopted or {}).get("adopted", []),
                     "down_s": round((timezone.now() - row.created_at).total_seconds(), 3)}
        else:
            outcome, extra = control_faults.freeze_stop(key=key, state=state), {}
        _record(kind=REVERTED_KIND, key=reverted_key(key), worker=row.worker, event="fault_reverted", audit=audit,
                outcome=outcome, by="the agent's restart", **extra)
        log.info("fault %s (%s) of node %s: %s at the agent's restart", key, fault, node_name, outcome)
        resumed.append(key)
    return resumed
