"""Where a run sends its control faults: a broker_freeze once, to the agent of a node on the broker's host (400
naming the fault when there is none online), an agent_kill once per node of its targets; and a run whose killed agent
never came back (no supervisor) fails with a report that says the fault was not reverted."""
from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from controlplane.chaos import fault_checks
from controlplane.chaos.report import verdict_of
from controlplane.chaos.services import experiment_create, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Node, Worker
from tests.controlplane.chaos.test_driver import steady_history


def _experiment(world, admin, fault: dict, count: int = 1):
    return experiment_create(deployment=world["deployment"], actor=admin, name=fault["kind"].replace("_", "-"),
                             target={"role": "decode", "count": count}, faults=[fault], duration_s=5,
                             hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])


@pytest.mark.django_db
def test_a_broker_freeze_with_no_agent_on_the_brokers_host_is_a_400_naming_the_fault(world, admin, operator,
                                                                                     online_node):
    online_node.hostname = "elsewhere.example"
    online_node.save(update_fields=["hostname"])
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=_experiment(world, admin, {"kind": "broker_freeze"}), actor=operator)
    assert refused.value.status == 400 and refused.value.extra["field"] == "faults[0].kind"
    assert "broker's host" in refused.value.message and "local (elsewhere.example)" in refused.value.message


@pytest.mark.django_db
def test_a_broker_freeze_goes_once_to_an_agent_on_the_brokers_host(world, admin, operator, online_node, gateway,
                                                                   agent_inline, django_capture_on_commit_callbacks):
    steady_history(gateway, time.time())
    online_node.hostname = "elsewhere.example"  # the target's node: not the broker's host
    online_node.save(update_fields=["hostname"])
    carrier = Node.objects.create(name="broker-host", hostname=socket.gethostname(),
                                  queue=Node.queue_for("broker-host"), last_seen_at=online_node.last_seen_at)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=_experiment(world, admin, {"kind": "broker_freeze"}), actor=operator)
    assert [(f["kind"], f["queue"], f["params"]) for f in run.faults] == [
        ("broker_freeze", carrier.queue, {"node": "broker-host"})]
    injects = [message for message in agent_inline if message[0] == "agent_fault_inject"]
    assert len(injects) == 1 and injects[0][2] == carrier.queue


@pytest.mark.django_db
def test_an_agent_kill_goes_once_per_node(world, admin, operator, gateway, make_worker, agent_inline,
                                          django_capture_on_commit_callbacks):
    steady_history(gateway, time.time())
    make_worker(world["deployment"], "decode")  # a second ready decode worker, on the same node
    assert Worker.objects.filter(role="decode", status="ready").count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=_experiment(world, admin, {"kind": "agent_kill"}, count=2), actor=operator)
    assert len(run.targets) == 2 and [f["kind"] for f in run.faults] == ["agent_kill"]
    assert [message[0] for message in agent_inline] == ["agent_fault_inject"]


def test_an_agent_kill_that_nobody_reverted_fails_the_run_saying_so():
    run = SimpleNamespace(recovered_at=1, abort_reason="", spec={"recovery_timeout_s": 60})
    killed = {"kind": "agent_kill", "worker": 7, "injected": {"ok": True, "outcome": "killed"}, "reverted": None}
    verdict, reasons = verdict_of(run, [killed])
    assert verdict == "failed" and "not reverted: the node agent has not come back" in reasons[0]


@pytest.fixture
def database_at(monkeypatch):
    """The database as db_slow's carrier choice sees it (never the session's own: nothing here is throttled, and
    the inline agent here is no node agent, which refuses it)."""
    def set_to(where: dict):
        monkeypatch.setattr(fault_checks, "database_here", lambda: where)
    return set_to


@pytest.mark.django_db
def test_a_db_slow_goes_once_with_its_ms_to_an_agent_on_the_databases_host(world, admin, operator, online_node,
                                                                           gateway, agent_inline, database_at,
                                                                           django_capture_on_commit_callbacks):
    steady_history(gateway, time.time())
    database_at({"database": "postgresql", "host": "127.0.0.1", "port": 1})
    online_node.hostname = "elsewhere.example"  # the target's node: not the database's host
    online_node.save(update_fields=["hostname"])
    carrier = Node.objects.create(name="db-host", hostname=socket.gethostname(), queue=Node.queue_for("db-host"),
                                  last_seen_at=online_node.last_seen_at)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=_experiment(world, admin, {"kind": "db_slow"}), actor=operator)
    assert [(f["kind"], f["queue"], f["params"]) for f in run.faults] == [
        ("db_slow", carrier.queue, {"ms": 50, "node": "db-host"})]
    injects = [message for message in agent_inline if message[0] == "agent_fault_inject"]
    assert len(injects) == 1 and injects[0][2] == carrier.queue


@pytest.mark.django_db
@pytest.mark.parametrize("where, field, says", [
    ({"database": "postgresql", "host": "db.elsewhere.example", "port": 5432}, "faults[0].kind",
     "database's host"),
    ({"database": "mysql"}, "faults[0].kind", "PostgreSQL or SQLite"),
    ({"database": "sqlite", "path": "/x.sqlite3"}, "faults[0].ms", "at most 50 ms"),
], ids=["another-host", "another-engine", "sqlite-over-half"])
def test_a_db_slow_that_cannot_be_carried_out_is_a_400_naming_the_field(world, admin, operator, database_at, where,
                                                                        field, says):
    database_at(where)
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=_experiment(world, admin, {"kind": "db_slow", "ms": 90}), actor=operator)
    assert refused.value.status == 400 and refused.value.extra["field"] == field and says in refused.value.message


@pytest.mark.django_db
@pytest.mark.parametrize("ms", [0, 91, "50", True])
def test_a_db_slow_ms_out_of_1_to_90_is_a_400_naming_the_field(world, admin, ms):
    with pytest.raises(ControlPlaneError) as refused:
        _experiment(world, admin, {"kind": "db_slow", "ms": ms})
    assert refused.value.status == 400 and refused.value.extra["field"] == "faults[0].ms"
