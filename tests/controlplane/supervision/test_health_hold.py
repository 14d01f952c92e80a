"""A health pass in which many probes of live hosts' workers time out at once restarts none of them (the prober or
its network is the likely cause: supervision.probe_hold), says so on /healthz and in a running `hold` action, and
lets go on the first pass that does not hold. Failures that are not timeouts, those on hosts whose agent went quiet,
and a few timeouts still restart as before."""
from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Action, ActionKind, ActionStatus, Worker, WorkerStatus
from controlplane.supervision.health import check_health
from tests.controlplane.supervision.test_health import health_server  # noqa: F401 (a fixture)
from tests.procs import free_port


@pytest.fixture
def silent_port():
    """A port that takes connections (the kernel's backlog) and never answers: a probe of it times out."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def fast_probes(settings):
    settings.TANDEM_HEALTH_TIMEOUT_S = 1
    settings.TANDEM_HEALTH_FAILURES = 1  # one failure restarts: a pass that restarts no one held on purpose
    settings.TANDEM_HEALTH_HOLD_PCT, settings.TANDEM_HEALTH_HOLD_MIN = 10, 10


def _ready(deployment, make_worker, n: int, port: int | None, *, node_seen_s_ago: float | None = 0) -> list[Worker]:
    from controlplane.models import Node

    node = Node.objects.get(name="local")
    node.last_seen_at = None if node_seen_s_ago is None else timezone.now() - timedelta(seconds=node_seen_s_ago)
    node.save(update_fields=["last_seen_at"])
    return [make_worker(deployment, "decode", port=port or free_port()) for _ in range(n)]


def _statuses(workers: list[Worker]) -> set[str]:
    return set(Worker.objects.filter(id__in=[w.id for w in workers]).values_list("status", flat=True))


def test_a_pass_where_many_probes_time_out_restarts_no_one_and_says_so(
        deployment, make_worker, silent_port, health_server, fast_probes, client, viewer, sent):  # noqa: F811
    workers = _ready(deployment, make_worker, 12, silent_port)
    outcome = check_health()
    assert sorted(outcome["held"]) == sorted(w.id for w in workers)
    assert outcome["restarted"] == [] and outcome["failing"] == []
    assert _statuses(workers) == {WorkerStatus.READY}
    assert set(Worker.objects.filter(id__in=[w.id for w in workers])
               .values_list("consecutive_health_failures", flat=True)) == {0}  # nothing counted either
    hold = Action.objects.get(kind=ActionKind.HOLD)
    assert hold.status == ActionStatus.RUNNING and "12 of 12 ready workers" in hold.reason
    body = client.get("/healthz").json()
    assert body["status"] == "degraded" and body["health_restarts"]["held"] is True
    assert any(p.startswith("health restarts held since") for p in body["problems"])
    client.force_login(viewer)
    assert 'data-testid="health-hold"' in client.get("/").content.decode()  # the fleet page's banner

    check_health()  # a second held pass: the same row, counted
    assert Action.objects.filter(kind=ActionKind.HOLD).count() == 1
    assert Action.objects.get(kind=ActionKind.HOLD).params["held_passes"] == 2

    Worker.objects.filter(id__in=[w.id for w in workers]).update(port=health_server.server_port)
    outcome = check_health()  # they answer again: the hold ends
    assert outcome["held"] == [] and outcome["restarted"] == []
    hold.refresh_from_db()
    assert hold.status == ActionStatus.SUCCEEDED and hold.result["held_passes"] == 2
    assert client.get("/healthz").json()["health_restarts"] == {"held": False}
    assert 'data-testid="health-hold"' not in client.get("/").content.decode()


def test_timeouts_on_a_host_whose_agent_went_quiet_still_restart(
        deployment, make_worker, silent_port, fast_probes, sent):
    workers = _ready(deployment, make_worker, 12, silent_port, node_seen_s_ago=3600)
    outcome = check_health()
    assert outcome["held"] == [] and sorted(outcome["restarted"]) == sorted(w.id for w in workers)
    assert _statuses(workers) == {WorkerStatus.PENDING}
    assert not Action.objects.filter(kind=ActionKind.HOLD).exists()


def test_refused_connections_are_not_held(deployment, make_worker, fast_probes, sent):
    workers = _ready(deployment, make_worker, 12, None)  # nothing listens: the processes are gone
    outcome = check_health()
    assert outcome["held"] == [] and sorted(outcome["restarted"]) == sorted(w.id for w in workers)


def test_a_few_timeouts_below_the_minimum_restart_as_before(
        deployment, make_worker, silent_port, health_server, fast_probes, sent):  # noqa: F811
    slow = _ready(deployment, make_worker, 3, silent_port)
    _ready(deployment, make_worker, 5, health_server.server_port)  # 3 of 8 time out: a share far above 10 %
    outcome = check_health()
    assert outcome["held"] == [] and sorted(outcome["restarted"]) == sorted(w.id for w in slow)


def test_timeouts_below_the_share_restart_as_before(
        deployment, make_worker, silent_port, health_server, fast_probes, settings, sent):  # noqa: F811
    settings.TANDEM_HEALTH_HOLD_MIN = 2
    slow = _ready(deployment, make_worker, 2, silent_port)
    _ready(deployment, make_worker, 30, health_server.server_port)  # 2 of 32 time out: 6 %, under 10 %
    outcome = check_health()
    assert outcome["held"] == [] and sorted(outcome["restarted"]) == sorted(w.id for w in slow)


def test_when_most_hosts_agents_are_quiet_at_once_their_timeouts_are_held_too(
        deployment, make_worker, silent_port, fast_probes, sent):
    """Heartbeats lagging on most nodes at once are the same overload's casualty (the broker, the database), not
    hosts gone: nothing tells them apart, so the pass holds as if the hosts were live."""
    from controlplane.models import Node

    quiet = _ready(deployment, make_worker, 12, silent_port, node_seen_s_ago=3600)
    other = Node.objects.create(name="other", hostname="other", last_seen_at=timezone.now() - timedelta(hours=1))
    quiet += [make_worker(deployment, "decode", port=silent_port, node=other) for _ in range(2)]
    outcome = check_health()
    assert sorted(outcome["held"]) == sorted(w.id for w in quiet) and outcome["restarted"] == []
