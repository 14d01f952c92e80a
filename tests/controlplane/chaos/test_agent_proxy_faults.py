"""The node agent's proxy faults on a real simulated worker: `error` puts a fault proxy in front of it and points
its row (what the gateway's membership and the health checks read) at the proxy, whose generation answers fail while
/health stays ok; a revert points the row back and stops the proxy; the agent's own timer reverts it at the deadline
with no message; an agent restarted meanwhile reverts it from the injected row; a chaos run sends the fault's
settings to the agent."""
from __future__ import annotations

import time

import pytest
import requests

from controlplane.agent import fault_holds, faults, processes
from controlplane.chaos.models import ChaosRun, RunStatus
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, Worker
from tests.controlplane.chaos.conftest import simulated_worker_for, wait_until

AUDIT = {"chaos_run": 1, "experiment": "t"}
BODY = {"prompt": "a b c", "max_tokens": 3, "ignore_eos": True}
pytestmark = pytest.mark.integration


@pytest.fixture
def sim_decode(world, tmp_path, settings):
    """world's decode row, served by a real simulated worker (a colocated one: it answers /v1/generate)."""
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    with simulated_worker_for(world["decode"], "colocated", tmp_path / "sim.log") as decode:
        yield decode


def _injected(key: str) -> Action:
    return Action.objects.get(idempotency_key=faults.injected_key(key))


@pytest.mark.django_db(transaction=True)
def test_an_error_fault_points_the_row_at_a_failing_proxy_until_its_revert(sim_decode):
    port = sim_decode.port
    assert faults.fault_inject(key="p-error", kind="error", worker_id=sim_decode.pk, until=time.time() + 60,
                               audit=AUDIT, params={"ratio": 1}) == "proxied"
    row = Worker.objects.get(pk=sim_decode.pk)
    assert row.port != port
    state = _injected("p-error").result
    assert state["outcome"] == "proxied" and state["proxy_port"] == row.port and state["upstream_port"] == port
    failed = requests.post(row.url + "/v1/generate", json=BODY, timeout=10)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "fault_injected"
    assert requests.get(row.url + "/health", timeout=10).json()["status"] == "ok"  # ready, as a bad canary is
    proxy = processes.ProcessHandle(state["proxy_pid"], state["proxy_started"], "fault-proxy:p-error")

    assert faults.fault_revert(key="p-error", kind="error", worker_id=sim_decode.pk, audit=AUDIT) == "restored"
    row.refresh_from_db()
    assert row.port == port
    assert requests.post(row.url + "/v1/generate", json=BODY, timeout=10).status_code == 200
    assert processes.wait_exit(proxy, 30)
    assert Action.objects.get(idempotency_key=faults.reverted_key("p-error")).result["by"] == "a revert"


@pytest.mark.django_db(transaction=True)
def test_the_agents_own_deadline_reverts_a_latency_fault(sim_decode):
    port = sim_decode.port
    # 6 s: the proxy's start takes ~2 s on a loaded machine, and the request below must still find it in place.
    assert faults.fault_inject(key="p-deadline", kind="latency", worker_id=sim_decode.pk, until=time.time() + 6,
                               audit=AUDIT, params={"ms": 200, "line_ms": 10}) == "proxied"
    row = Worker.objects.get(pk=sim_decode.pk)
    began = time.monotonic()
    assert requests.post(row.url + "/v1/generate", json=BODY, timeout=10).status_code == 200
    assert time.monotonic() - began >= 0.2
    # No revert is ever sent.
    wait_until("the row to name the worker again", lambda: Worker.objects.get(pk=sim_decode.pk).port == port)
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("p-deadline")).first())
    assert reverted.result["outcome"] == "restored" and reverted.result["by"] == "the agent's deadline"
    assert fault_holds.paused_keys() == []


@pytest.mark.django_db(transaction=True)
def test_an_agent_restarted_meanwhile_reverts_from_the_injected_row(sim_decode):
    port = sim_decode.port
    faults.fault_inject(key="p-restart", kind="error", worker_id=sim_decode.pk, until=time.time() + 60,
                        audit=AUDIT, params={"ratio": 1})
    with fault_holds.held_lock:  # the agent restarts: its timers and what it held are gone
        fault_holds.held.pop("p-restart").timer.cancel()
    state = _injected("p-restart").result
    assert faults.fault_revert(key="p-restart", kind="error", worker_id=sim_decode.pk, audit=AUDIT) == "restored"
    assert Worker.objects.get(pk=sim_decode.pk).port == port
    assert processes.wait_exit(processes.ProcessHandle(state["proxy_pid"], state["proxy_started"],
                                                       "fault-proxy:p-restart"), 30)


@pytest.mark.django_db(transaction=True)
def test_a_run_sends_the_faults_settings_and_targets_a_revision(world, admin, operator, gateway, agent_inline,
                                                                django_capture_on_commit_callbacks, monkeypatch):
    from controlplane.chaos.services import experiment_create, run_start

    experiment = experiment_create(
        deployment=world["deployment"], actor=admin, name="slow-decode",
        target={"role": "decode", "count": 1, "revision": world["decode"].revision.number},
        faults=[{"kind": "latency", "ms": 250}], duration_s=5,
        hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])
    from controlplane.agent import tasks
    monkeypatch.setattr(tasks, "fault_inject", lambda **kwargs: "proxied")  # what it sends, not what it does
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    assert run.targets[0]["worker"] == world["decode"].pk
    (name, args, _), = agent_inline
    assert name == "agent_fault_inject" and args[1] == "latency" and args[-1] == {"ms": 250, "line_ms": 0}
    other = experiment_create(
        deployment=world["deployment"], actor=admin, name="no-such-revision",
        target={"role": "decode", "count": 1, "revision": 99}, faults=[{"kind": "error"}], duration_s=5,
        hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])
    ChaosRun.objects.filter(pk=run.pk).update(status=RunStatus.FINISHED)
    with pytest.raises(ControlPlaneError, match="of revision 99"):
        run_start(experiment=other, actor=operator)
