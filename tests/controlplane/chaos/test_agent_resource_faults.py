"""The resource faults on real hogs: cpu_hog burns CPU and memory_pressure holds resident memory on the target
worker's host until a revert or the agent's deadline; the hog exits at its own deadline with no agent at all; an
agent restarted meanwhile stops it from the injected row; more memory than the host (or the node's registered
memory, at run start) can give is refused naming `mib`. Each with stress-ng when installed and the Python hog."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from controlplane.agent import fault_holds, faults, processes, resource_faults
from controlplane.chaos.services import experiment_create, run_abort, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionStatus
from tests.controlplane.chaos.conftest import wait_until

AUDIT = {"chaos_run": 1, "experiment": "t"}
TOOLS = ["python", pytest.param("stress-ng", marks=pytest.mark.skipif(
    shutil.which("stress-ng") is None, reason="stress-ng is not installed (apt-get install stress-ng)"))]


@pytest.fixture(params=TOOLS)
def tool(request, monkeypatch, settings, tmp_path):
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    if request.param == "python":
        monkeypatch.setattr(resource_faults, "stress_ng", lambda: None)
    return request.param


def _group(pid: int) -> list[psutil.Process]:
    """The hog's process group: `timeout`, the hog and its workers."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (proc.pid == pid or os.getpgid(proc.pid) == pid) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return found


def _cpu_seconds(pid: int) -> float:
    total = 0.0
    for proc in _group(pid):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _rss_mib(pid: int) -> float:
    largest = 0
    for proc in _group(pid):
        try:
            largest = max(largest, proc.memory_info().rss)
        except psutil.Error:
            pass
    return largest / (1024 * 1024)


def _injected(key: str) -> Action:
    return Action.objects.get(idempotency_key=faults.injected_key(key))


@pytest.mark.django_db(transaction=True)
def test_a_cpu_hog_burns_cpu_until_its_revert(world, tool):
    key = f"r-cpu-{tool}"
    assert faults.fault_inject(key=key, kind="cpu_hog", worker_id=world["decode"].pk, until=time.time() + 60,
                               audit=AUDIT, params={"workers": 1}) == "hogging"
    state = _injected(key).result
    assert state["outcome"] == "hogging" and state["tool"] == tool
    pid = state["hog_pid"]
    wait_until("the hog to burn a CPU second", lambda: _cpu_seconds(pid) > 0.5, timeout=30)
    assert faults.fault_revert(key=key, kind="cpu_hog", worker_id=world["decode"].pk, audit=AUDIT) == "stopped"
    wait_until("the hog to be gone", lambda: _group(pid) == [])
    assert Action.objects.get(idempotency_key=faults.reverted_key(key)).result["by"] == "a revert"


@pytest.mark.django_db(transaction=True)
def test_memory_pressure_holds_its_memory_and_the_agents_deadline_ends_it(world, tool):
    key = f"r-mem-{tool}"
    assert faults.fault_inject(key=key, kind="memory_pressure", worker_id=world["decode"].pk,
                               until=time.time() + 4, audit=AUDIT, params={"mib": 64}) == "hogging"
    pid = _injected(key).result["hog_pid"]
    wait_until("64 MiB resident", lambda: _rss_mib(pid) >= 60, timeout=15)
    # No revert is ever sent: the agent's timer stops it.
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key(key)).first(), timeout=20)
    assert reverted.result["by"] == "the agent's deadline"
    wait_until("the hog to be gone", lambda: _group(pid) == [])
    assert fault_holds.paused_keys() == []


@pytest.mark.django_db(transaction=True)
def test_a_hog_ends_at_its_own_deadline_without_an_agent(world, tool):
    """The agent is gone (nothing holds the fault, no timer): the hog exits at its deadline by itself."""
    state = resource_faults.hog_start(key=f"r-alone-{tool}", kind="cpu_hog", worker_id=world["decode"].pk,
                                      until=time.time() + 2, params={"workers": 1})
    handle = resource_faults.hog_handle(f"r-alone-{tool}", state)
    assert processes.is_alive(handle)
    assert processes.wait_exit(handle, 15)
    wait_until("its workers to be gone too", lambda: _group(state["hog_pid"]) == [])


@pytest.mark.django_db(transaction=True)
def test_an_agent_restarted_meanwhile_stops_the_hog_from_the_injected_row(world, tool):
    key = f"r-restart-{tool}"
    faults.fault_inject(key=key, kind="memory_pressure", worker_id=world["decode"].pk, until=time.time() + 60,
                        audit=AUDIT, params={"mib": 16})
    with fault_holds.held_lock:  # the agent restarts: its timers and what it held are gone
        fault_holds.held.pop(key).timer.cancel()
    pid = _injected(key).result["hog_pid"]
    assert _group(pid)
    assert faults.fault_revert(key=key, kind="memory_pressure", worker_id=world["decode"].pk,
                               audit=AUDIT) == "stopped"
    wait_until("the hog to be gone", lambda: _group(pid) == [])


@pytest.mark.django_db(transaction=True)
def test_the_agent_refuses_more_memory_than_the_host_has(world, settings, tmp_path):
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    too_much = resource_faults.memory_available_mib() + 1
    assert faults.fault_inject(key="r-big", kind="memory_pressure", worker_id=world["decode"].pk,
                               until=time.time() + 60, audit=AUDIT, params={"mib": too_much}) == "failed"
    injected = _injected("r-big")
    assert injected.status == ActionStatus.FAILED and injected.result["error"].startswith("mib: ")
    assert fault_holds.paused_keys() == []


def _experiment(world, admin, name, faults_, **extra):
    return experiment_create(deployment=world["deployment"], actor=admin, name=name,
                             target={"role": "decode", "count": 1}, faults=faults_, duration_s=30,
                             hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}], **extra)


@pytest.mark.django_db
@pytest.mark.parametrize("fault, field", [
    ({"kind": "memory_pressure"}, "faults[0].mib"),
    ({"kind": "memory_pressure", "mib": 0}, "faults[0].mib"),
    ({"kind": "memory_pressure", "mib": 1.5}, "faults[0].mib"),
    ({"kind": "cpu_hog", "workers": 0}, "faults[0].workers"),
    ({"kind": "cpu_hog", "workers": 2.5}, "faults[0].workers"),
    ({"kind": "cpu_hog", "mib": 4}, "faults[0].mib"),
])
def test_bad_resource_faults_are_400s_naming_the_field(world, admin, fault, field):
    with pytest.raises(ControlPlaneError) as error:
        _experiment(world, admin, "bad", [fault])
    assert error.value.status == 400 and error.value.extra["field"] == field


@pytest.mark.django_db(transaction=True)
def test_a_run_refuses_more_than_the_nodes_memory_and_reverts_what_it_started(
        world, admin, operator, agent_inline, django_capture_on_commit_callbacks, online_node, settings, tmp_path):
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    online_node.detected_labels = {"memory_gib": 1}
    online_node.save(update_fields=["detected_labels"])
    greedy = _experiment(world, admin, "greedy", [{"kind": "memory_pressure", "mib": 600}])
    with pytest.raises(ControlPlaneError) as error:
        run_start(experiment=greedy, actor=operator)
    assert error.value.status == 400 and error.value.extra["field"] == "faults[0].mib"

    modest = _experiment(world, admin, "modest", [{"kind": "memory_pressure", "mib": 16},
                                                  {"kind": "cpu_hog", "workers": 1}])
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=modest, actor=operator)
    keys = [fault["key"] for fault in run.__class__.objects.get(pk=run.pk).faults]
    pids = [_injected(key).result["hog_pid"] for key in keys]
    assert all(_group(pid) for pid in pids)
    with django_capture_on_commit_callbacks(execute=True):
        run_abort(run=run, actor=operator)
    for key, pid in zip(keys, pids):
        assert Action.objects.get(idempotency_key=faults.reverted_key(key)).result["outcome"] == "stopped"
        wait_until("the hog to be gone", lambda p=pid: _group(p) == [])


@pytest.mark.parametrize("what", [["--cpu", "2"], ["--memory-mib", "8"]])
def test_the_python_hog_exits_at_its_deadline_by_itself(what):
    """Without `timeout` around it: the deadline is the hog's own."""
    began = time.time()
    done = subprocess.run([sys.executable, str(resource_faults.HOG_SCRIPT), "--until", f"{began + 1:.3f}", *what],
                          timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert 1 <= time.time() - began < 15
