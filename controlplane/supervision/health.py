"""Health: probe /health of every starting and ready process at once, and act on the answers.

- starting → ready on the first 200 (a gateway counts as up as soon as it answers at all: it says 503 until its
  pools have ready workers, which is not its own failure); a worker's 200 also says the dtype it runs, kept on its
  row for the pages and the API;
- starting that is not healthy within TANDEM_STARTUP_TIMEOUT_S → restart;
- ready with TANDEM_HEALTH_FAILURES consecutive failures → restart (reported to controlplane.services.restarts).

A dead process is the node agent's heartbeat to report (it sees the pid); this module only sees HTTP.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import requests
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.models import Worker, WorkerRole, WorkerStatus
from controlplane.models import ActionKind
from controlplane.services.actions import worker_actions_finish
from controlplane.services.restarts import WorkerFailure, worker_failure_record

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Probe:
    worker_id: int
    pid: int | None
    ok: bool
    detail: str
    dtype: str = ""  # what a healthy worker says it runs ("auto" resolved); blank for gateways and old workers


def probe(worker: Worker, timeout_s: float) -> Probe:
    url = f"{worker.url}/health"
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        return Probe(worker.id, worker.pid, False, f"GET {url}: {type(exc).__name__}")
    if response.status_code == 200 or (worker.role == WorkerRole.GATEWAY and response.status_code == 503):
        return Probe(worker.id, worker.pid, True, "", dtype=_dtype_of(response))
    return Probe(worker.id, worker.pid, False, f"GET {url}: HTTP {response.status_code} {response.text[:200]}")


def _dtype_of(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    dtype = body.get("dtype") if isinstance(body, dict) else None
    # Stored in a 20-character column and shown on pages: anything else is not a dtype.
    return dtype if isinstance(dtype, str) and dtype.isidentifier() and len(dtype) <= 20 else ""


def check_health(deployment_id: int | None = None) -> dict[str, list[int]]:
    """One pass over every starting/ready process (of one deployment, or all). Returns ids per outcome."""
    workers = Worker.objects.filter(status__in=(WorkerStatus.STARTING, WorkerStatus.READY),
                                    port__isnull=False, pid__isnull=False)
    if deployment_id is not None:
        workers = workers.filter(deployment_id=deployment_id)
    workers = list(workers)
    outcome: dict[str, list[int]] = {"ready": [], "failing": [], "restarted": []}
    if not workers:
        return outcome
    timeout_s = settings.TANDEM_HEALTH_TIMEOUT_S
    probed_at = timezone.now()
    with ThreadPoolExecutor(max_workers=min(16, len(workers))) as pool:
        probes = list(pool.map(lambda w: probe(w, timeout_s), workers))
    for worker, result in zip(workers, probes):
        _apply(worker, result, outcome, probed_at)
    return outcome


def _apply(worker: Worker, result: Probe, outcome: dict, probed_at) -> None:
    now = timezone.now()
    if result.ok:
        reported = {"dtype": result.dtype} if result.dtype else {}
        if Worker.objects.filter(id=worker.id, status=WorkerStatus.STARTING, pid=result.pid).update(
                status=WorkerStatus.READY, ready_at=now, last_health_at=now, consecutive_health_failures=0,
                **reported):
            worker_actions_finish(worker_id=worker.id, kind=ActionKind.RESTART, succeeded=True)
            outcome["ready"].append(worker.id)
            log.info("worker %s (%s) is ready", worker.id, worker.role)
        else:
            Worker.objects.filter(id=worker.id, status=WorkerStatus.READY, pid=result.pid).update(
                last_health_at=now, consecutive_health_failures=0, **reported)
        return
    if worker.status == WorkerStatus.STARTING:
        started = worker.started_at or worker.created_at
        if now - started > timedelta(seconds=settings.TANDEM_STARTUP_TIMEOUT_S):
            reason = f"not healthy within {settings.TANDEM_STARTUP_TIMEOUT_S} s of its start ({result.detail})"
            if worker_failure_record(failure=WorkerFailure(worker.id, result.pid, (WorkerStatus.STARTING,), reason)):
                outcome["restarted"].append(worker.id)
        return
    with transaction.atomic():
        row = Worker.objects.select_for_update().filter(id=worker.id, status=WorkerStatus.READY,
                                                        pid=result.pid).first()
        if row is None:
            return
        if row.last_health_at is not None and row.last_health_at > probed_at:
            # An overlapping pass (beat fires every interval, a pass can take a timeout) already recorded this
            # period's result: one failure must not count twice.
            return
        failures = row.consecutive_health_failures + 1
        Worker.objects.filter(id=row.id).update(consecutive_health_failures=failures, last_health_at=now,
                                                last_error=result.detail)
    outcome["failing"].append(worker.id)
    if failures >= settings.TANDEM_HEALTH_FAILURES:
        reason = f"health check failed {failures} times ({result.detail})"
        if worker_failure_record(failure=WorkerFailure(worker.id, result.pid, (WorkerStatus.READY,), reason)):
            outcome["restarted"].append(worker.id)
