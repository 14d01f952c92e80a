"""Health: probe /health of every starting and ready process at once, and act on the answers.

- starting → ready on the first 200 (a gateway counts as up as soon as it answers at all: it says 503 until its
  pools have ready workers, which is not its own failure); a worker's 200 also says the dtype it runs and its
  weights (quantization, bytes), kept on its row for the pages and the API;
- starting that is not healthy within TANDEM_STARTUP_TIMEOUT_S → restart; one that answers 503 "starting" (up,
  loading or compiling), or runs another engine (vLLM answers nothing until it has compiled), within
  TANDEM_WARMUP_TIMEOUT_S;
- ready with TANDEM_HEALTH_FAILURES consecutive failures → restart (reported to controlplane.services.restarts);
- but a pass in which many probes of live hosts' workers time out at once counts none of those timeouts (a restart
  storm caused by the prober's own overload: controlplane.supervision.probe_hold).

A dead process is the node agent's heartbeat to report (it sees the pid); this module only sees HTTP.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta

import aiohttp
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.lib.fleet_http import PASS_SLACK_S, fleet_http, gather_bounded, get_text, pass_bound_s
from controlplane.models import Worker, WorkerStatus
from controlplane.models.workers import (
    health_answer_dtype, health_answer_ok, health_answer_status, health_answer_weights,
)
from controlplane.services.restarts import WorkerFailure, worker_failure_record, worker_ready_record
from controlplane.supervision import probe_hold
from inference.engines import TANDEM, engine_of

log = logging.getLogger(__name__)

PROBE_CONCURRENCY = 128  # probes in flight at once; each holds a kept-alive connection (controlplane.lib.fleet_http)
_RECORD_BATCH = 500  # (id, pid) pairs per UPDATE: 1,000 parameters, far below any backend's limit


@dataclass(frozen=True, slots=True)
class Probe:
    worker_id: int
    pid: int | None
    ok: bool
    detail: str
    dtype: str = ""  # what a healthy worker says it runs ("auto" resolved); blank for gateways and old workers
    weights: dict = field(default_factory=dict)  # its quantization and weight_bytes (health_answer_weights)
    timed_out: bool = False  # no complete answer in time (not a refused connection, not an unhealthy answer)
    starting: bool = False  # a worker's 503 "starting": its process is up, loading the model or compiling


@dataclass(frozen=True, slots=True)
class _Answer:
    """A /health answer, read as health_answer_* read a response: status_code and json()."""
    status_code: int
    text: str

    def json(self):
        return json.loads(self.text)  # ValueError (JSONDecodeError) when it is not JSON, as requests' is


async def _probe(session, worker: Worker, timeout_s: float) -> Probe:
    url = f"{worker.url}/health"
    try:
        status, text = await get_text(session, url, timeout_s=timeout_s)
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError) as exc:
        # aiohttp's socket and connect timeouts are asyncio.TimeoutErrors too
        return Probe(worker.id, worker.pid, False, f"GET {url}: {type(exc).__name__}",
                     timed_out=isinstance(exc, asyncio.TimeoutError))
    answer = _Answer(status, text)
    if health_answer_ok(worker.role, status):
        return Probe(worker.id, worker.pid, True, "", dtype=health_answer_dtype(answer),
                     weights=health_answer_weights(answer))
    return Probe(worker.id, worker.pid, False, f"GET {url}: HTTP {status} {text[:200]}",
                 starting=status == 503 and health_answer_status(answer) == "starting")


def probe_all(workers: list[Worker], timeout_s: float) -> list[Probe]:
    """Probe every worker at once (at most PROBE_CONCURRENCY in flight), over the process's kept-alive connections;
    results in the order of `workers`. A worker still answering when the pass's bound is up has failed its probe."""
    bound_s = pass_bound_s(len(workers), PROBE_CONCURRENCY, timeout_s)

    def late(worker: Worker) -> Probe:
        return Probe(worker.id, worker.pid, False,
                     f"GET {worker.url}/health: no complete answer within the pass's bound of {bound_s:.0f} s",
                     timed_out=True)

    async def probes(session):
        return await gather_bounded(workers, lambda worker: _probe(session, worker, timeout_s),
                                    concurrency=PROBE_CONCURRENCY, bound_s=bound_s, late=late)

    return fleet_http().run(probes, timeout_s=bound_s + PASS_SLACK_S)


def check_health(deployment_id: int | None = None) -> dict[str, list[int]]:
    """One pass over every starting/ready process (of one deployment, or all). Returns ids per outcome."""
    workers = Worker.objects.filter(status__in=(WorkerStatus.STARTING, WorkerStatus.READY),
                                    port__isnull=False, pid__isnull=False)
    if deployment_id is not None:
        workers = workers.filter(deployment_id=deployment_id)
    workers = list(workers)
    outcome: dict[str, list[int]] = {"ready": [], "failing": [], "restarted": [], "held": []}
    if not workers:
        return outcome
    timeout_s = settings.TANDEM_HEALTH_TIMEOUT_S
    probed_at = timezone.now()
    probes = probe_all(workers, timeout_s)
    healthy: list[Worker] = []
    failing: list[Probe] = []
    for worker, result in zip(workers, probes):
        if (result.ok and worker.status == WorkerStatus.READY and result.dtype in ("", worker.dtype)
                and all(getattr(worker, key) == value for key, value in result.weights.items())):
            healthy.append(worker)  # nothing new to record but the probe: written for all of them at once below
        elif not result.ok and worker.status == WorkerStatus.READY:
            failing.append(result)  # counted for all of them in one transaction below
        else:
            _apply(worker, result, outcome)
    _record_healthy(healthy)
    ready = [worker for worker in workers if worker.status == WorkerStatus.READY]
    held = probe_hold.held_ids(ready, [probe.worker_id for probe in failing if probe.timed_out])
    if held:
        failing = [probe for probe in failing if probe.worker_id not in held]
        outcome["held"] = sorted(held)
    _record_failing(failing, outcome, probed_at)
    if ready and deployment_id is None:  # the hold is the fleet's: a pass over one deployment neither opens nor ends it
        probe_hold.record_pass(num_ready=len(ready), held=held)
    return outcome


def _record_healthy(workers: list[Worker]) -> None:
    """One UPDATE for every ready worker that answered as before (at a thousand workers, one query per worker was
    most of a pass). Conditional on status and pid as the per-worker update is: a row that moved on is left alone.
    The (id, pid) pairs go in as a VALUES list: the ORM's OR of a thousand (id AND pid) terms took longer to build
    than the probes took to answer. Row values in IN hold on PostgreSQL and SQLite (3.15+)."""
    if not workers:
        return
    table, quote = Worker._meta.db_table, connection.ops.quote_name
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        for start in range(0, len(workers), _RECORD_BATCH):
            batch = workers[start:start + _RECORD_BATCH]
            pairs = ", ".join(["(%s, %s)"] * len(batch))
            cursor.execute(
                f"UPDATE {quote(table)} SET {quote('last_health_at')} = %s, "
                f"{quote('consecutive_health_failures')} = 0 WHERE {quote('status')} = %s "
                f"AND ({quote('id')}, {quote('pid')}) IN (VALUES {pairs})",
                [now, WorkerStatus.READY.value, *(value for w in batch for value in (w.id, w.pid))])


def _apply(worker: Worker, result: Probe, outcome: dict) -> None:
    """A worker that answered with something new (ready at last, another dtype or weights), or a starting one that
    did not answer (restarted once its startup time is up)."""
    now = timezone.now()
    if result.ok:
        reported = {"dtype": result.dtype, **result.weights} if result.dtype else dict(result.weights)
        if worker.status == WorkerStatus.STARTING and worker_ready_record(
                worker_id=worker.id, pid=result.pid, dtype=result.dtype, weights=result.weights):
            outcome["ready"].append(worker.id)
        else:
            Worker.objects.filter(id=worker.id, status=WorkerStatus.READY, pid=result.pid).update(
                last_health_at=now, consecutive_health_failures=0, **reported)
        return
    if worker.status == WorkerStatus.STARTING:
        started = worker.started_at or worker.created_at
        deadline_s = settings.TANDEM_STARTUP_TIMEOUT_S
        # Up and loading or compiling: the warm-up's deadline. A vLLM worker listens only once it has loaded and
        # compiled, so its start gets the warm-up's deadline from the first (its exit is the agent's to report).
        if result.starting or (worker.revision_id is not None
                               and engine_of(worker.revision.engine_settings) != TANDEM):
            deadline_s = max(deadline_s, settings.TANDEM_WARMUP_TIMEOUT_S)
        if now - started > timedelta(seconds=deadline_s):
            reason = f"not healthy within {deadline_s} s of its start ({result.detail})"
            if worker_failure_record(failure=WorkerFailure(worker.id, result.pid, (WorkerStatus.STARTING,), reason)):
                outcome["restarted"].append(worker.id)


def _record_failing(probes: list[Probe], outcome: dict, probed_at) -> None:
    """Count a failed probe for each ready worker, in one transaction for all of them (a host gone takes all its
    workers with it), and restart those that failed TANDEM_HEALTH_FAILURES times in a row. A row that moved on
    (another status, another pid) is left alone."""
    if not probes:
        return
    now = timezone.now()
    by_id = {probe.worker_id: probe for probe in probes}
    counted: list[Worker] = []
    with transaction.atomic():
        rows = Worker.objects.select_for_update().filter(id__in=list(by_id), status=WorkerStatus.READY).only(
            "id", "pid", "last_health_at", "consecutive_health_failures").order_by("id")
        for row in rows:
            probe = by_id[row.id]
            if row.pid != probe.pid:
                continue
            if row.last_health_at is not None and row.last_health_at > probed_at:
                # An overlapping pass (beat fires every interval, a pass can take a timeout) already recorded this
                # period's result: one failure must not count twice.
                continue
            row.consecutive_health_failures += 1
            row.last_health_at, row.last_error = now, probe.detail
            counted.append(row)
        Worker.objects.bulk_update(counted, ["consecutive_health_failures", "last_health_at", "last_error"],
                                   batch_size=_RECORD_BATCH)
    for row in counted:
        probe = by_id[row.id]
        outcome["failing"].append(row.id)
        if row.consecutive_health_failures >= settings.TANDEM_HEALTH_FAILURES:
            reason = f"health check failed {row.consecutive_health_failures} times ({probe.detail})"
            if worker_failure_record(failure=WorkerFailure(row.id, probe.pid, (WorkerStatus.READY,), reason)):
                outcome["restarted"].append(row.id)
