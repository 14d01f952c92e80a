"""On a GPU node, a worker whose revision asks for `cuda` (or `auto`) is pinned to the least used GPU through
CUDA_VISIBLE_DEVICES; CPU revisions and CPU nodes are left alone. (NVML is mocked by the node's GPU list: no GPU
here.)"""
from __future__ import annotations

import time

import psutil

from controlplane.agent import launch
from controlplane.agent.workers import worker_start
from controlplane.models import Revision, Worker, WorkerStatus

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 << 30}


def _gpu_revision(deployment, device: str) -> Revision:
    current = deployment.current_revision
    return Revision.objects.create(deployment=deployment, number=current.number + 1, model_path=current.model_path,
                                   engine_settings={"device": device})


def _start(deployment, node, revision, cleanup) -> Worker:
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=revision, node=node, status=WorkerStatus.PENDING)
    assert worker_start(worker_id=worker.id, node_name=node.name) == "started"
    worker.refresh_from_db()
    cleanup.append(launch.handle_of(worker))
    return worker


def _environ(pid: int) -> dict:
    """The process's environment once it has exec'd: between fork and exec, /proc shows the parent's."""
    parent = psutil.Process().cmdline()
    deadline = time.monotonic() + 10
    while psutil.Process(pid).cmdline() == parent:
        assert time.monotonic() < deadline, f"process {pid} did not exec within 10 s"
        time.sleep(0.02)
    return psutil.Process(pid).environ()


def test_cuda_workers_spread_over_the_node_gpus_one_each(deployment, online_node, fake_worker_argv,
                                                         cleanup_processes):
    online_node.gpus = [{"index": 0, **H100}, {"index": 1, **H100}]
    online_node.save()
    revision = _gpu_revision(deployment, "cuda")
    first = _start(deployment, online_node, revision, cleanup_processes)
    second = _start(deployment, online_node, revision, cleanup_processes)
    assert {first.gpu_index, second.gpu_index} == {0, 1}
    for worker in (first, second):
        assert _environ(worker.pid)["CUDA_VISIBLE_DEVICES"] == str(worker.gpu_index)
        assert _environ(worker.pid)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's numbering, not fastest-first


def test_a_cpu_revision_or_a_cpu_node_gets_no_gpu(deployment, online_node, fake_worker_argv, cleanup_processes):
    cpu_worker = _start(deployment, online_node, deployment.current_revision, cleanup_processes)
    auto_on_cpu_node = _start(deployment, online_node, _gpu_revision(deployment, "auto"), cleanup_processes)
    for worker in (cpu_worker, auto_on_cpu_node):
        assert worker.gpu_index is None
        assert "CUDA_VISIBLE_DEVICES" not in _environ(worker.pid)


def test_auto_resolves_to_the_node_hardware_and_private_settings_stay_out_of_the_worker(
        deployment, online_node, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "not-for-workers")
    worker = Worker(deployment=deployment, role="decode", node=online_node, id=99,
                    revision=_gpu_revision(deployment, "auto"))
    assert launch.argv_for(worker, 1234)[launch.argv_for(worker, 1234).index("--device") + 1] == "cpu"
    online_node.gpus = [{"index": 0, **H100}]
    assert launch.argv_for(worker, 1234)[launch.argv_for(worker, 1234).index("--device") + 1] == "cuda"
    assert "SECRET_KEY" not in launch.env_for(worker)
