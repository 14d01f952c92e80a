"""A health pass over many ready workers that answer as before writes them in one UPDATE, not one per worker, and
still leaves alone a row that moved on meanwhile (a restart changed its pid). So does a pass over many that fail
(a host gone takes all its workers with it): their failures are counted in one transaction."""
from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.models import Worker, WorkerStatus
from controlplane.supervision.health import check_health
from tests.controlplane.supervision.test_health import health_server  # noqa: F401 (a fixture)
from tests.procs import free_port


def _ready_workers(deployment, make_worker, port: int | None, n: int) -> list[Worker]:
    before = timezone.now() - timezone.timedelta(minutes=5)
    return [make_worker(deployment, "decode", status=WorkerStatus.READY, port=port or free_port(),
                        started_at=before, last_health_at=before, consecutive_health_failures=1)
            for i in range(n)]


def _num_worker_writes(queries) -> int:
    return sum(q["sql"].startswith("UPDATE") and "controlplane_worker" in q["sql"] for q in queries.captured_queries)


def test_the_writes_of_a_pass_do_not_grow_with_the_ready_workers(deployment, make_worker, health_server):  # noqa: F811
    workers = _ready_workers(deployment, make_worker, health_server.server_port, 12)
    with CaptureQueriesContext(connection) as queries:
        check_health()
    assert _num_worker_writes(queries) == 1
    for worker in workers:
        worker.refresh_from_db()
        assert worker.consecutive_health_failures == 0 and worker.last_health_at > worker.started_at


def test_a_row_whose_pid_changed_during_the_pass_is_not_written(deployment, make_worker, health_server,  # noqa: F811
                                                                monkeypatch):
    moved, kept = _ready_workers(deployment, make_worker, health_server.server_port, 2)
    from controlplane.supervision import health

    real_record = health._record_healthy

    def restart_then_record(workers):
        Worker.objects.filter(id=moved.id).update(pid=9999)  # a restart between the probe and the write
        real_record(workers)

    monkeypatch.setattr(health, "_record_healthy", restart_then_record)
    check_health()
    moved.refresh_from_db()
    kept.refresh_from_db()
    assert moved.consecutive_health_failures == 1 and kept.consecutive_health_failures == 0


def test_the_failures_of_a_pass_are_counted_in_one_write(deployment, make_worker, monkeypatch):
    workers = _ready_workers(deployment, make_worker, None, 12)  # nothing listens on their ports
    moved = workers.pop()
    from controlplane.supervision import health

    real_probe_all = health.probe_all

    def probe_then_restart(*args):
        probes = real_probe_all(*args)
        Worker.objects.filter(id=moved.id).update(pid=9999)  # a restart between the probe and the write
        return probes

    monkeypatch.setattr(health, "probe_all", probe_then_restart)
    with CaptureQueriesContext(connection) as queries:
        outcome = check_health()
    assert sorted(outcome["failing"]) == sorted(w.id for w in workers) and outcome["restarted"] == []
    assert _num_worker_writes(queries) == 2  # the test's own restart, and one for the pass's 11 failures
    for worker in workers:
        worker.refresh_from_db()
        assert worker.consecutive_health_failures == 2 and "ClientConnectorError" in worker.last_error
    moved.refresh_from_db()
    assert (moved.consecutive_health_failures, moved.last_error) == (1, "")
