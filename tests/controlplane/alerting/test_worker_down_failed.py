"""A worker that supervision left `failed` is still down: the default "worker down" rule keeps firing until the
worker is ready again, stopped (an operator's scale-down or delete) or replaced by a rollout. Real scrape cycles
(one at a time, at fixed instants) feed the rule, as beat does."""
from __future__ import annotations

import pytest

from controlplane.models import Worker
from controlplane.observability.store import scrape_cycle
from tests.procs import free_port


@pytest.fixture
def cycle(evaluate, at):
    """cycle(second): one scrape cycle stored at T0 + second, then one evaluation pass at the same instant."""
    def run(second: int) -> None:
        scrape_cycle(now=at(second).timestamp())
        evaluate(at(second))

    return run


def worker_down_alert(worker):
    from controlplane.alerting.models import Alert

    return Alert.objects.filter(rule__default_key="worker-down", worker=worker).order_by("-id").first()


def test_a_failed_worker_keeps_the_alert_firing_until_it_is_stopped(deployment, make_worker, cycle):
    sick = make_worker(deployment, "decode", port=free_port())  # nothing listens there: every scrape fails
    for second in range(0, 40, 5):
        cycle(second)
    assert worker_down_alert(sick).state == "firing"

    # Supervision gives up on it: no process, so nothing is scraped any more; it is still down.
    Worker.objects.filter(pk=sick.pk).update(status="failed", pid=None)
    for second in range(40, 160, 5):
        cycle(second)
        assert worker_down_alert(sick).state == "firing", f"resolved at {second} s while the worker is failed"

    # An operator scales it away (reconcile drains a failed worker to `stopped`): no slot, no alert.
    Worker.objects.filter(pk=sick.pk).update(status="stopped")
    for second in range(160, 220, 5):
        cycle(second)
    assert worker_down_alert(sick).state == "resolved"


def test_a_failed_worker_of_a_revision_rolled_away_from_does_not_fire(deployment, second_revision, make_worker,
                                                                      cycle):
    from controlplane.models import Revision

    first = Revision.objects.get(deployment=deployment, number=1)
    replaced = make_worker(deployment, "decode", status="failed", revision=first)  # holds no slot of revision 2
    current = make_worker(deployment, "prefill", status="failed")  # revision 2: keeps its slot
    for second in range(0, 60, 5):
        cycle(second)
    assert worker_down_alert(replaced) is None
    assert worker_down_alert(current).state == "firing"


def test_a_failed_worker_that_is_ready_again_resolves_the_alert(deployment, make_worker, cycle, metrics_servers):
    from prometheus_client import CollectorRegistry

    from inference.metrics import TandemMetrics

    sick = make_worker(deployment, "decode", status="failed")
    for second in range(0, 60, 5):
        cycle(second)
    assert worker_down_alert(sick).state == "firing"
    # An operator's restart brings it back: its new process answers the scrapes.
    port = metrics_servers.serve_metrics(TandemMetrics(role="decode", model="tiny", registry=CollectorRegistry(),
                                                       gpu=False))
    Worker.objects.filter(pk=sick.pk).update(status="ready", port=port, pid=4242)
    for second in range(60, 120, 5):
        cycle(second)
    assert worker_down_alert(sick).state == "resolved"
