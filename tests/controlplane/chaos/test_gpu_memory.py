"""The resource fault gpu_memory: N MiB held on one GPU of the target worker's node by a holder child
(controlplane/agent/gpu_hold.py) until its revert or deadline.

This host has no GPU, and so: the API's checks against the node's GPUs (none, an unknown index, more memory than
the GPU has) run for real, through the API and the run start; the agent spawns the real holder, which exits with
its one clear line (no CUDA here) that the injected row reports; the holder's process group dies on the agent's
stop as a memory_pressure hog's does; and the holder's allocation path runs in this process with torch.cuda (the
GPU) mocked, its allocation made on the host instead. Nothing here held memory on a real GPU."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from controlplane.agent import fault_holds, faults, gpu_hold, processes, resource_faults
from controlplane.chaos.services import experiment_create, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionStatus, Worker
from tests.controlplane.chaos.conftest import wait_until
from tests.controlplane.chaos.test_agent_resource_faults import _group

BASE = "/api/v1/deployments/demo/chaos"
AUDIT = {"chaos_run": 1, "experiment": "t"}
GIB = 1024 ** 3
H200 = {"index": 0, "name": "NVIDIA H200", "memory_total_bytes": 141 * GIB}
SMALL = {"index": 1, "name": "NVIDIA T4", "memory_total_bytes": 15 * GIB}


def _experiment(world, admin, name, faults_):
    return experiment_create(deployment=world["deployment"], actor=admin, name=name,
                             target={"role": "decode", "count": 1}, faults=faults_, duration_s=30,
                             hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}])


def _refused(world, admin, operator, name, fault) -> ControlPlaneError:
    experiment = _experiment(world, admin, name, [fault])
    with pytest.raises(ControlPlaneError) as error:
        run_start(experiment=experiment, actor=operator)
    return error.value


def _gpus(node, gpus):
    node.gpus = gpus
    node.save(update_fields=["gpus"])


@pytest.mark.django_db
@pytest.mark.parametrize("fault, field", [
    ({"kind": "gpu_memory"}, "faults[0].mib"),
    ({"kind": "gpu_memory", "mib": 0}, "faults[0].mib"),
    ({"kind": "gpu_memory", "mib": -5}, "faults[0].mib"),
    ({"kind": "gpu_memory", "mib": 1.5}, "faults[0].mib"),
    ({"kind": "gpu_memory", "mib": 64, "gpu": -1}, "faults[0].gpu"),
    ({"kind": "gpu_memory", "mib": 64, "gpu": "0"}, "faults[0].gpu"),
    ({"kind": "gpu_memory", "mib": 64, "workers": 2}, "faults[0].workers"),
])
def test_bad_gpu_memory_faults_are_400s_naming_the_field(world, admin, fault, field):
    with pytest.raises(ControlPlaneError) as error:
        _experiment(world, admin, "bad", [fault])
    assert error.value.status == 400 and error.value.extra["field"] == field


@pytest.mark.django_db
def test_gpu_is_optional_and_kept_when_given(world, admin):
    assert _experiment(world, admin, "plain", [{"kind": "gpu_memory", "mib": 64}]).faults == [
        {"kind": "gpu_memory", "mib": 64}]
    assert _experiment(world, admin, "named", [{"kind": "gpu_memory", "mib": 64, "gpu": 1}]).faults == [
        {"kind": "gpu_memory", "mib": 64, "gpu": 1}]


@pytest.mark.django_db(transaction=True)
def test_a_run_on_a_node_without_a_gpu_is_a_400_naming_the_kind_through_the_api(world, online_node, api_for, admin,
                                                                                operator):
    assert online_node.gpus == []  # as every CPU host registers (NVML found nothing)
    created = api_for(admin).post(f"{BASE}/experiments", {
        "name": "gpu-hold", "target": {"role": "decode"}, "faults": [{"kind": "gpu_memory", "mib": 64}],
        "duration_s": 10, "hypothesis": [{"metric": "ready_workers", "role": "decode", "min": 1}]}, format="json")
    assert created.status_code == 201, created.text
    refused = api_for(operator).post(f"{BASE}/experiments/gpu-hold/run", {}, format="json")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["field"] == "faults[0].kind" and f"node {online_node.name!r} has no GPU" in error["message"], error
    assert not Action.objects.filter(params__fault="gpu_memory").exists()  # nothing reached an agent


@pytest.mark.django_db(transaction=True)
def test_a_run_checks_the_gpu_and_its_memory(world, online_node, admin, operator):
    _gpus(online_node, [H200, SMALL])
    error = _refused(world, admin, operator, "too-much", {"kind": "gpu_memory", "mib": 141 * 1024 + 1})
    assert error.status == 400 and error.extra["field"] == "faults[0].mib"
    assert "GPU 0 of node 'local' has (144384 MiB, NVIDIA H200)" in str(error), str(error)

    error = _refused(world, admin, operator, "no-such-gpu", {"kind": "gpu_memory", "mib": 64, "gpu": 3})
    assert error.status == 400 and error.extra["field"] == "faults[0].gpu" and "its GPUs: 0, 1" in str(error)

    # No `gpu`: the target worker's GPU, here the small one.
    Worker.objects.filter(pk=world["decode"].pk).update(gpu_index=1)
    error = _refused(world, admin, operator, "worker-gpu", {"kind": "gpu_memory", "mib": 16 * 1024})
    assert error.status == 400 and error.extra["field"] == "faults[0].mib" and "GPU 1 of node" in str(error)
    Worker.objects.filter(pk=world["decode"].pk).update(gpu_index=5)
    error = _refused(world, admin, operator, "worker-gpu-gone", {"kind": "gpu_memory", "mib": 64})
    assert error.status == 400 and error.extra["field"] == "faults[0].kind" and "no GPU 5" in str(error)


@pytest.mark.django_db(transaction=True)
def test_the_agent_spawns_the_holder_which_fails_without_cuda_and_the_row_says_why(
        world, online_node, admin, operator, agent_inline, django_capture_on_commit_callbacks, settings, tmp_path):
    """The whole path on this CPU host: the API accepts the fault (the node registered a GPU), the agent spawns the
    real holder on the worker's GPU (1), which finds no CUDA and exits; the injected row is a failure with its line,
    and no holder is left."""
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    _gpus(online_node, [H200, SMALL])
    Worker.objects.filter(pk=world["decode"].pk).update(gpu_index=1)
    experiment = _experiment(world, admin, "held", [{"kind": "gpu_memory", "mib": 64}])
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    key, = [fault["key"] for fault in run.__class__.objects.get(pk=run.pk).faults]
    injected = Action.objects.get(idempotency_key=faults.injected_key(key))
    assert injected.status == ActionStatus.FAILED and injected.result["outcome"] == "failed", injected.result
    error = injected.result["error"]
    assert error.startswith("the gpu_memory holder exited before it held the memory: ")
    assert "gpu_memory: CUDA is not available on this host" in error and "CUDA_VISIBLE_DEVICES=1)" in error
    assert "no GPU 1 to hold memory on" in error, error
    assert fault_holds.paused_keys() == []
    log = (tmp_path / "logs" / f"resource-fault-worker-{world['decode'].pk}.log").read_text()
    assert "gpu_hold.py --until" in log and "--mib 64 --gpu 1" in log


@pytest.mark.django_db(transaction=True)
def test_the_agent_stops_the_holders_process_group_as_a_hogs(world, settings, tmp_path):
    """The holder's command under `timeout`, as the agent starts it, caught before it could fail (SIGSTOP): the
    revert machinery of the hogs (hog_stop from the recorded pid and create time) kills its whole group."""
    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    key = "g-stop"
    argv = resource_faults.gpu_hold_argv({"mib": 64}, 0, time.time() + 60)
    assert argv[:3] == ["timeout", "--signal=KILL", "65s"] and argv[4] == str(resource_faults.GPU_HOLD_SCRIPT)
    handle = processes.spawn(argv, log_path=tmp_path / "logs" / "hold.log", marker=resource_faults.marker_of(key),
                             cwd=Path(settings.BASE_DIR))
    processes.signal_group(handle, signal.SIGSTOP)
    state = {"hog_pid": handle.pid, "hog_started": handle.create_time}
    assert _group(handle.pid), "the holder's group is alive (stopped)"
    assert resource_faults.resource_stop(key=key, state=state) == "stopped"
    wait_until("the holder's group to be gone", lambda: _group(handle.pid) == [])
    assert resource_faults.resource_stop(key=key, state=state) == "gone"


def test_the_holder_alone_exits_2_with_one_line_without_cuda():
    done = subprocess.run([sys.executable, str(resource_faults.GPU_HOLD_SCRIPT), "--until", f"{time.time() + 30:.3f}",
                           "--mib", "8", "--gpu", "2"], env={"CUDA_VISIBLE_DEVICES": "2", "PATH": "/usr/bin:/bin"},
                          timeout=120, capture_output=True, text=True)
    assert done.returncode == gpu_hold.EXIT_FAILED, (done.stdout, done.stderr)
    assert done.stdout.startswith("gpu_memory: CUDA is not available on this host") and "no GPU 2" in done.stdout


@pytest.fixture
def mocked_gpu(monkeypatch):
    """torch.cuda answers as a GPU with 1 GiB free of 2 would; an allocation asked of it lands on the host."""
    free = {"bytes": GIB}
    allocated = []
    real_empty = torch.empty

    def empty(*size, device=None, **kwargs):
        assert device == torch.device("cuda", 0)
        tensor = real_empty(*size, device="cpu", **kwargs)
        allocated.append(tensor)
        return tensor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 2 * GIB))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mocked GPU")
    monkeypatch.setattr(torch, "empty", empty)
    return free, allocated


def test_the_holder_allocates_writes_and_holds_until_its_deadline(mocked_gpu, capsys):
    _, allocated = mocked_gpu
    began = time.time()
    assert gpu_hold.hold(48, 3, until=began + 1) == 0
    assert 1 <= time.time() - began < 10
    block, = allocated
    assert block.dtype == torch.uint8 and block.numel() == 48 * gpu_hold.MIB and bool((block == 1).all())
    assert capsys.readouterr().out.startswith("holding 48 MiB on GPU 3 (Mocked GPU) until ")


def test_the_holder_refuses_more_than_the_gpu_has_free(mocked_gpu, capsys):
    _, allocated = mocked_gpu
    assert gpu_hold.hold(1025, 0, until=time.time() + 30) == gpu_hold.EXIT_FAILED
    assert allocated == []
    assert capsys.readouterr().out == "gpu_memory: GPU 0 has 1024 MiB free of 2048 MiB; 1025 MiB asked\n"


def test_an_allocation_that_fails_is_one_line(mocked_gpu, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB\nmore detail")

    monkeypatch.setattr(torch, "empty", out_of_memory)
    assert gpu_hold.hold(64, 1, until=time.time() + 30) == gpu_hold.EXIT_FAILED
    assert capsys.readouterr().out == ("gpu_memory: allocating 64 MiB on GPU 1 failed: CUDA out of memory. Tried "
                                       "to allocate 64.00 MiB\n")
