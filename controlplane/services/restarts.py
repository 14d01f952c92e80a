"""Restarts: the one place a worker goes back to `pending` to be started again, and the restart policy.

A failure is reported as data (a WorkerFailure): by the node agent when a process exits or cannot be spawned, by
the health checker when a process stops answering. The policy here decides: restart with exponential backoff, or,
after TANDEM_MAX_RESTARTS restarts within TANDEM_RESTART_WINDOW_S, leave the worker `failed` with an action row that
says so. An operator's restart (a pending `restart` action, carried out by reconcile) takes the same path without
backoff.

A restart is in place (the same Worker row, restart_count + 1): the row goes back to `pending` with
`next_restart_at`, and reconcile hands it to its node agent once that time has come. The restarts in the window
are counted from the audit log (system restart actions of that worker), not from a second counter.
"""
from __future__ import annotations

import logging
import re
import signal
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.celery import RECONCILE_DEPLOYMENT, RECONCILE_SHARED_GATEWAY, task_send
from controlplane.models import Action, ActionKind, ActionStatus, Worker, WorkerStatus
from controlplane.services.actions import Actor, action_create, worker_actions_finish

log = logging.getLogger(__name__)

SUPERVISOR = Actor.system("supervisor")


@dataclass(frozen=True, slots=True)
class WorkerFailure:
    """What was seen to go wrong with one worker's process. Only a failure of the row as it was seen counts:
    if the row has moved on (another status, another pid), the report is stale and ignored."""

    worker_id: int
    pid: int | None  # the process the report is about; None: no process was started
    from_statuses: tuple[str, ...]  # the statuses the row may still have for the report to apply
    reason: str  # one line: what happened, and the last warning or error its log has
    log_tail: str = ""  # the end of its log, progress bars removed (kept on the action row, not in the reason)

    @classmethod
    def exited(cls, *, worker_id: int, pid: int, exit_code: int | None, log_tail: str = "") -> "WorkerFailure":
        """A process that ended on its own. exit_code as its parent, the node agent, learnt it (< 0: killed by
        signal -exit_code; None: unknown, an earlier agent started it); log_tail: what this process wrote."""
        tail = clean_log(log_tail)
        return cls(worker_id, pid, (WorkerStatus.STARTING, WorkerStatus.READY),
                   exit_reason(exit_code=exit_code, log_tail=tail), tail)

    @classmethod
    def not_started(cls, *, worker_id: int, detail: str) -> "WorkerFailure":
        """A claimed start (`starting`) whose process could not be spawned."""
        return cls(worker_id, None, (WorkerStatus.STARTING,), detail)


_PROGRESS_BAR = re.compile(r"\d+%\|.*\|")  # tqdm: " 45%|████▌     | 9/20 [00:01<00:01, 8.1it/s]"
MAX_REASON_CHARS = 300


def exit_reason(*, exit_code: int | None, log_tail: str, ended: str = "process ended",
                now: datetime | None = None) -> str:
    """One line that says only what is known of a process that ended: how (its exit code or signal; else `ended`
    and that its exit status is unknown) and the last warning or error line of its own log, with how long before
    `now` (when the end was seen; default: now) it was written where that is over STALE_LINE_S: a line written
    minutes before a kill is not its cause, and the reason must not read as if it were."""
    if exit_code is None:
        how = f"{ended}; exit status unknown (started by an earlier agent)"
    elif exit_code >= 0:
        how = f"process exited with code {exit_code}"
    else:
        try:
            how = f"process killed by signal {-exit_code} ({signal.Signals(-exit_code).name})"
        except ValueError:
            how = f"process killed by signal {-exit_code}"
    problem = last_problem(clean_log(log_tail), now=now or datetime.now())
    return f"{how}; {problem}" if problem else how


def clean_log(text: str) -> str:
    """A log tail without progress bars: each line as its last carriage-return redraw left it, bar lines dropped."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line and not _PROGRESS_BAR.search(line))


# A log record's level where the format puts it: the workers' "%(asctime)s decode[%(process)d] LEVEL name: ...",
# the gateway's "%(asctime)s LEVEL name: ...", logging's default "LEVEL:name:...".
_LEVEL = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.\d]*\s+(?:\S+\s+)??)?"
                    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)[\s:]")
_TRACEBACK = "Traceback (most recent call last):"
_PYTHON_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")  # warnings.warn's "file.py:12: UserWarning: ..."
_FATAL = re.compile(r"^(Fatal Python error: |terminate called )")  # faulthandler; a C++ exception nothing caught


# A problem line written this long before the end was seen is quoted with its age (exit_reason).
STALE_LINE_S = 30.0
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")


def _age_s(line: str, now: datetime) -> float | None:
    """Seconds from the line's own time stamp (the log format's local time) to `now`, or None without one."""
    stamp = _STAMP.match(line)
    if not stamp:
        return None
    try:
        return (now - datetime.fromisoformat(stamp.group(1).replace(" ", "T"))).total_seconds()
    except ValueError:
        return None


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def last_problem(tail: str, *, now: datetime | None = None) -> str:
    """'last warning in its log: <line>' or 'last error in its log: <line>', for the last WARNING, ERROR or
    CRITICAL record of a log tail (by the level its format writes), the last line of a Python traceback (the
    exception), a Python warning or a fatal error; '' when it has none. INFO and DEBUG records are never quoted, and
    neither are lines without a level (a library's chatter), which say nothing of how bad they are. With `now`
    (naive local time, as the log's stamps), a line stamped over STALE_LINE_S before it says how long before."""
    found, in_traceback = None, False
    for line in tail.splitlines():
        level = _LEVEL.match(line)
        if level:
            in_traceback = False
            if level.group(1) in ("WARNING", "ERROR", "CRITICAL"):
                found = ("warning" if level.group(1) == "WARNING" else "error", line)
        elif line.startswith(_TRACEBACK):
            in_traceback = True
        elif in_traceback:
            if not line[:1].isspace():  # past the indented frames: the exception that ends the traceback
                found, in_traceback = ("error", line), False
        elif _PYTHON_WARNING.match(line):
            found = ("warning", line)
        elif _FATAL.match(line):
            found = ("error", line)
    if found is None:
        return ""
    kind, line = found
    age = _age_s(line, now) if now is not None else None
    when = f", written {_ago(age)} before its end was seen" if age is not None and age > STALE_LINE_S else ""
    return f"last {kind} in its log{when}: {line.strip()[:MAX_REASON_CHARS]}"


def backoff_seconds(num_recent_restarts: int) -> int:
    """1, 2, 4, ... seconds before the next start, capped by TANDEM_RESTART_BACKOFF_MAX_S."""
    return min(2 ** min(num_recent_restarts, 30), settings.TANDEM_RESTART_BACKOFF_MAX_S)


def worker_back_to_pending(*, worker: Worker, from_status: str, reason: str,
                           next_restart_at: datetime | None = None, **fields) -> bool:
    """The in-place restart every restart goes through: the row (still in from_status) returns to pending for
    reconcile to start again. False if the row changed meanwhile (another process handled it)."""
    num_updated = Worker.objects.filter(id=worker.id, status=from_status).update(
        status=WorkerStatus.PENDING, last_error=reason, next_restart_at=next_restart_at,
        restart_count=worker.restart_count + 1, consecutive_health_failures=0, ready_at=None, **fields,
    )
    return num_updated == 1


def worker_ready_record(*, worker_id: int, pid: int | None, dtype: str = "", weights: dict | None = None) -> bool:
    """A starting worker's process (still `pid`) answered its health check: it is ready (running `dtype`, and with
    the `weights` of health_answer_weights, when it said), and the restart that brought it back is done. Reported by
    the health checker or by the worker's own node agent, whichever sees it first; False if the row had moved on
    (or the other one got there first)."""
    now = timezone.now()
    reported = {"dtype": dtype} if dtype else {}
    reported.update(weights or {})
    num_updated = Worker.objects.filter(id=worker_id, status=WorkerStatus.STARTING, pid=pid).update(
        status=WorkerStatus.READY, ready_at=now, last_health_at=now, consecutive_health_failures=0, **reported)
    if num_updated != 1:
        return False
    worker_actions_finish(worker_id=worker_id, kind=ActionKind.RESTART, succeeded=True)
    log.info("worker %s is ready", worker_id)
    return True


def worker_failure_record(*, failure: WorkerFailure) -> str | None:
    """Restart (or give up on) a worker that failed. Returns "restart", "fail", or None when the report is stale
    (the row is no longer in failure.from_statuses with that pid: it was already handled).

    1. Lock the row; bail out unless it is still the failure reported (status and pid unchanged).
    2. Count this worker's system restarts inside the window (the audit log is the counter).
    3. Below the limit: back to pending with a backoff, a `restart` action (running until the worker is ready).
       At the limit: `failed`, a `fail` action, and any unfinished restart action of it fails too.
    """
    now = timezone.now()
    with transaction.atomic():
        worker = (Worker.objects.select_for_update(of=("self",)).select_related("deployment")
                  .filter(id=failure.worker_id).first())
        if worker is None or worker.status not in failure.from_statuses or worker.pid != failure.pid:
            return None
        window_start = now - timedelta(seconds=settings.TANDEM_RESTART_WINDOW_S)
        recent = Action.objects.filter(worker=worker, kind=ActionKind.RESTART, actor_type=SUPERVISOR.type,
                                       created_at__gte=window_start)
        num_recent = recent.count()
        if num_recent >= settings.TANDEM_MAX_RESTARTS:
            message = (f"{failure.reason}; gave up after {num_recent} restarts within "
                       f"{settings.TANDEM_RESTART_WINDOW_S} s")
            Worker.objects.filter(id=worker.id).update(
                status=WorkerStatus.FAILED, last_error=message, stopped_at=now, next_restart_at=None,
            )
            worker_actions_finish(worker_id=worker.id, kind=ActionKind.RESTART, succeeded=False, error=message)
            action_create(kind=ActionKind.FAIL, actor=SUPERVISOR, deployment=worker.deployment, worker=worker,
                          reason=message, status=ActionStatus.SUCCEEDED,
                          params={"role": worker.role, "pid": failure.pid, "num_restarts_in_window": num_recent,
                                  "log_tail": failure.log_tail})
            log.error("worker %s (%s) failed: %s", worker.id, worker.role, message)
            return "fail"
        delay = backoff_seconds(num_recent)
        first_in_window = recent.order_by("created_at").values_list("created_at", flat=True).first()
        worker_back_to_pending(worker=worker, from_status=worker.status, reason=failure.reason,
                               next_restart_at=now + timedelta(seconds=delay),
                               restart_window_started_at=first_in_window or now)
        action_create(kind=ActionKind.RESTART, actor=SUPERVISOR, deployment=worker.deployment, worker=worker,
                      reason=failure.reason, status=ActionStatus.RUNNING,
                      params={"role": worker.role, "pid": failure.pid, "backoff_s": delay,
                              "restart_count": worker.restart_count + 1, "log_tail": failure.log_tail})
        # Beat's periodic reconcile would also get there; this makes the restart happen right after the backoff.
        # A shared gateway's process has no deployment: its own reconcile starts it again.
        task, owner_id = ((RECONCILE_DEPLOYMENT, worker.deployment_id) if worker.deployment_id is not None
                          else (RECONCILE_SHARED_GATEWAY, worker.shared_gateway_id))
        transaction.on_commit(lambda: task_send(task, args=(owner_id,), countdown=delay + 0.1), robust=True)
    log.warning("worker %s (%s) restarts in %d s: %s", failure.worker_id, worker.role, delay, failure.reason)
    return "restart"
