"""A failed worker is restarted in place with exponential backoff; after TANDEM_MAX_RESTARTS restarts within the
window it is left failed, and action rows say each of those things."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from controlplane.models import Action, ActionStatus, Worker, WorkerStatus
from controlplane.services.restarts import WorkerFailure, backoff_seconds, worker_failure_record

READY = (WorkerStatus.STARTING, WorkerStatus.READY)


def _fail(worker, reason: str) -> str | None:
    return worker_failure_record(failure=WorkerFailure(worker.id, worker.pid, READY, reason))


def test_backoff_doubles_from_one_second_up_to_the_cap(settings):
    settings.TANDEM_RESTART_BACKOFF_MAX_S = 10
    assert [backoff_seconds(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_a_dead_worker_goes_back_to_pending_after_a_backoff_with_a_restart_action(deployment, make_worker, sent):
    worker = make_worker(deployment, "decode")
    before = timezone.now()
    assert _fail(worker, "process exited (signal 9)") == "restart"
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING and worker.restart_count == 1
    assert before + timedelta(seconds=1) <= worker.next_restart_at <= timezone.now() + timedelta(seconds=1)
    action = Action.objects.get(kind="restart", worker=worker)
    assert (action.actor_type, action.status, action.reason) == ("system", "running", "process exited (signal 9)")
    assert action.params["backoff_s"] == 1


def test_the_second_restart_in_the_window_waits_twice_as_long(deployment, make_worker, sent):
    worker = make_worker(deployment, "decode")
    for expected_backoff in (1, 2):
        Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
        _fail(worker, "dead")
    assert [a.params["backoff_s"] for a in Action.objects.filter(worker=worker).order_by("id")] == [1, 2]


def test_a_failure_already_handled_elsewhere_is_not_counted_twice(deployment, make_worker, sent):
    worker = make_worker(deployment, "decode")
    assert _fail(worker, "a")
    # The health checker saw the same dead process a moment later: the row is pending now, nothing happens.
    assert _fail(worker, "b") is None
    assert Action.objects.filter(worker=worker).count() == 1


def test_after_max_restarts_in_the_window_the_worker_is_failed_and_a_fail_action_says_so(
        deployment, make_worker, settings, sent):
    settings.TANDEM_MAX_RESTARTS = 2
    worker = make_worker(deployment, "decode")
    outcomes = []
    for _ in range(3):
        Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
        outcomes.append(_fail(worker, "health check failed 3 times"))
    assert outcomes == ["restart", "restart", "fail"]
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.FAILED and "gave up after 2 restarts" in worker.last_error
    fail = Action.objects.get(kind="fail", worker=worker)
    assert fail.actor_type == "system" and fail.status == ActionStatus.SUCCEEDED
    assert not Action.objects.filter(kind="restart", worker=worker, status=ActionStatus.RUNNING).exists()


def test_restarts_older_than_the_window_do_not_count(deployment, make_worker, settings, sent):
    settings.TANDEM_MAX_RESTARTS = 1
    worker = make_worker(deployment, "decode")
    _fail(worker, "dead")
    Action.objects.filter(worker=worker).update(
        created_at=timezone.now() - timedelta(seconds=settings.TANDEM_RESTART_WINDOW_S + 1))
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    assert _fail(worker, "dead") == "restart"


LOG_WITH_BARS = (
    "Loading weights:   0%|          | 0/30 [00:00<?, ?it/s]\rLoading weights:  50%|█████     | 15/30 [00:01<00:01]"
    "\rLoading weights: 100%|██████████| 30/30 [00:02<00:00, 14.2it/s]\n"
    "Traceback (most recent call last):\n"
    '  File "/srv/inference/worker/__main__.py", line 20, in <module>\n'
    "    server.run()\n"
    "OSError: [Errno 98] Address already in use\n"
)


def test_an_exit_reason_is_one_line_naming_the_error_and_the_log_tail_is_kept_apart(deployment, make_worker, sent):
    worker = make_worker(deployment, "decode")
    failure = WorkerFailure.exited(worker_id=worker.id, pid=worker.pid, exit_code=1, log_tail=LOG_WITH_BARS)
    assert failure.reason == ("process exited with code 1; last error in its log: "
                              "OSError: [Errno 98] Address already in use")
    assert "%|" not in failure.log_tail and failure.log_tail.startswith("Traceback")
    assert worker_failure_record(failure=failure) == "restart"
    worker.refresh_from_db()
    assert worker.last_error == failure.reason
    action = Action.objects.get(kind="restart", worker=worker)
    assert action.reason == failure.reason and action.params["log_tail"] == failure.log_tail


def test_a_signal_without_a_log_says_just_that(deployment, make_worker, sent):
    worker = make_worker(deployment, "decode")
    failure = WorkerFailure.exited(worker_id=worker.id, pid=worker.pid, exit_code=-9, log_tail="")
    assert failure.reason == "process killed by signal 9 (SIGKILL)" and failure.log_tail == ""


def test_a_log_line_written_long_before_a_kill_is_quoted_with_its_age_not_as_its_cause():
    from datetime import datetime

    from controlplane.services.restarts import exit_reason

    now = datetime(2026, 12, 7, 4, 40, 0)
    old = "2026-12-07 04:28:00,100 WARNING tandem.gateway: control plane http://cp: timeout (keeping the last good)"
    fresh = "2026-12-07 04:39:55,000 ERROR tandem.gateway: out of file descriptors"
    stale = exit_reason(exit_code=-9, log_tail=old + "\n2026-12-07 04:39:00,000 INFO tandem.gateway: polled", now=now)
    assert stale.startswith("process killed by signal 9 (SIGKILL); last warning in its log, written 12 min before "
                            "its end was seen: ")
    assert exit_reason(exit_code=1, log_tail=old + "\n" + fresh, now=now) == (
        f"process exited with code 1; last error in its log: {fresh}")
