"""One health pass probes /health over real HTTP: starting → ready on 200; N consecutive failures of a ready worker
restart it; a starting worker gets its startup deadline; a gateway that answers 503 (no ready pool yet) is up."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Action, Worker, WorkerStatus
from controlplane.supervision.health import check_health
from tests.http_stub import JsonStub


@pytest.fixture
def health_server():
    """A /health endpoint whose status code the test sets (server.code), and the fields of its 200 (server.extra)."""

    server = JsonStub(lambda path: (server.code, {"status": "ok", **server.extra} if server.code == 200
                                    else server.other))
    server.code = 200
    server.extra = {}  # more fields of the 200 answer
    server.other = {"status": "starting"}  # the answer of any other code
    yield server
    server.close()


def test_a_starting_worker_becomes_ready_on_its_first_200(deployment, make_worker, health_server):
    worker = make_worker(deployment, "decode", status=WorkerStatus.STARTING, port=health_server.server_port,
                         started_at=timezone.now())
    assert check_health()["ready"] == [worker.id]
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY and worker.ready_at is not None


def test_a_ready_worker_is_restarted_after_the_configured_number_of_failed_checks(
        deployment, make_worker, health_server, settings, sent):
    settings.TANDEM_HEALTH_FAILURES = 3
    worker = make_worker(deployment, "decode", port=health_server.server_port)
    health_server.code = 500
    assert check_health()["restarted"] == [] and check_health()["restarted"] == []
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY and worker.consecutive_health_failures == 2
    assert check_health()["restarted"] == [worker.id]
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING
    assert Action.objects.get(kind="restart", worker=worker).reason.startswith("health check failed 3 times")


def test_one_good_answer_resets_the_failure_count(deployment, make_worker, health_server, settings):
    settings.TANDEM_HEALTH_FAILURES = 2
    worker = make_worker(deployment, "decode", port=health_server.server_port)
    health_server.code = 500
    check_health()
    health_server.code = 200
    check_health()
    health_server.code = 500
    check_health()
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY and worker.consecutive_health_failures == 1


def test_an_unreachable_starting_worker_is_left_alone_until_its_startup_deadline(
        deployment, make_worker, settings, sent):
    from tests.procs import free_port

    settings.TANDEM_STARTUP_TIMEOUT_S = 60
    fresh = make_worker(deployment, "decode", status=WorkerStatus.STARTING, port=free_port(),
                        started_at=timezone.now())
    late = make_worker(deployment, "prefill", status=WorkerStatus.STARTING, port=free_port(),
                       started_at=timezone.now() - timedelta(seconds=61))
    assert check_health()["restarted"] == [late.id]
    assert Worker.objects.get(id=fresh.id).status == WorkerStatus.STARTING
    assert "not healthy within 60 s" in Worker.objects.get(id=late.id).last_error


def test_a_worker_answering_starting_gets_the_warm_up_deadline_and_one_answering_otherwise_does_not(
        deployment, make_worker, health_server, settings, sent):
    # A worker compiling its decode step (2.6 min for SmolLM2 on an H200) answers 503 "starting" for minutes: it is
    # up, so the startup deadline (for a start that never answers) is not its deadline.
    settings.TANDEM_STARTUP_TIMEOUT_S, settings.TANDEM_WARMUP_TIMEOUT_S = 60, 600
    health_server.code = 503
    health_server.other = {"status": "starting", "reason": "loading the model, then compiling its decode step"}
    compiling = make_worker(deployment, "decode", status=WorkerStatus.STARTING, port=health_server.server_port,
                            started_at=timezone.now() - timedelta(seconds=300))
    stuck = make_worker(deployment, "prefill", status=WorkerStatus.STARTING, port=health_server.server_port,
                        started_at=timezone.now() - timedelta(seconds=601))
    assert check_health()["restarted"] == [stuck.id]
    assert Worker.objects.get(id=compiling.id).status == WorkerStatus.STARTING
    assert "not healthy within 600 s" in Worker.objects.get(id=stuck.id).last_error
    # A 503 that is not "starting" (its engine died while loading) gets the startup deadline.
    health_server.other = {"status": "dead", "reason": "loading the model failed"}
    assert check_health()["restarted"] == [compiling.id]
    assert "not healthy within 60 s" in Worker.objects.get(id=compiling.id).last_error


def test_a_gateway_answering_503_without_ready_pools_counts_as_up(deployment, make_worker, health_server):
    health_server.code = 503
    gateway = make_worker(deployment, "gateway", status=WorkerStatus.STARTING, port=health_server.server_port,
                          started_at=timezone.now())
    assert check_health()["ready"] == [gateway.id]


def test_overlapping_passes_count_one_failure_once(deployment, make_worker, health_server):
    from controlplane.supervision.health import Probe, _record_failing

    worker = make_worker(deployment, "decode", port=health_server.server_port)
    started = timezone.now()
    failed = Probe(worker.id, worker.pid, False, "GET /health: HTTP 500")
    _record_failing([failed], {"failing": [], "restarted": [], "ready": []}, started)
    _record_failing([failed], {"failing": [], "restarted": [], "ready": []}, started)  # the same period, again
    worker.refresh_from_db()
    assert worker.consecutive_health_failures == 1


def test_the_dtype_a_worker_reports_is_kept_on_its_row(deployment, make_worker, health_server):
    worker = make_worker(deployment, "decode", status=WorkerStatus.STARTING, port=health_server.server_port,
                         started_at=timezone.now())
    assert deployment.current_revision.dtype == "auto" and worker.dtype == ""
    health_server.extra = {"dtype": "bfloat16"}
    check_health()
    assert Worker.objects.get(id=worker.id).dtype == "bfloat16"
    health_server.extra = {"dtype": "<script>"}  # not a dtype: the last good answer stays
    check_health()
    assert Worker.objects.get(id=worker.id).dtype == "bfloat16"
