"""While make run waits, what happens to the demo's workers reaches the terminal as it happens: a restart with the
reason the agent reported (the last line of the process's log), and a worker that failed ends the wait."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Worker
from controlplane.run.demo import DemoWatch, NotReady

BIND_ERROR = ("process exited (exit code 1)\nTraceback (most recent call last):\n  ...\nOSError: [Errno 98] error "
              "while attempting to bind on address ('127.0.0.1', 8001): address already in use")


def test_a_restart_is_reported_once_with_the_exception_of_the_log(deployment, make_worker):
    gateway = make_worker(deployment, "gateway", status="starting")
    lines: list[str] = []
    watch = DemoWatch(deployment.pk, since=timezone.now(), report=lines.append)
    watch()
    assert lines == []
    Worker.objects.filter(pk=gateway.pk).update(status="pending", restart_count=1, last_error=BIND_ERROR)
    watch()
    watch()
    assert lines == [f"the demo's gateway worker #{gateway.pk} (port {gateway.port}) is restarting: process exited "
                     "(exit code 1): OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', "
                     "8001): address already in use"]


def test_a_worker_that_failed_during_this_run_ends_the_wait(deployment, make_worker):
    since = timezone.now()
    earlier = make_worker(deployment, "decode", status="failed", stopped_at=since - timedelta(hours=1))
    watch = DemoWatch(deployment.pk, since=since, report=lambda line: None)
    watch()  # failed before this run: not this run's news
    Worker.objects.filter(pk=earlier.pk).update(stopped_at=timezone.now(), last_error=BIND_ERROR)
    with pytest.raises(NotReady, match=rf"decode worker #{earlier.pk} .* failed: .*address already in use"):
        watch()
