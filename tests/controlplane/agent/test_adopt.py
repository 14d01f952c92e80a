"""A (re)starting agent keeps the workers whose processes still run and marks the others stopped."""
from __future__ import annotations

import signal

from controlplane.agent import launch, processes
from controlplane.agent.node import node_adopt
from controlplane.agent.workers import worker_start
from controlplane.models import Worker, WorkerStatus


def _worker(deployment, node, **fields):
    return Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                 revision=deployment.current_revision, node=node, **fields)


def test_it_adopts_live_workers_and_stops_the_rows_of_dead_ones(deployment, online_node, fake_worker_argv,
                                                                cleanup_processes):
    alive, dead = _worker(deployment, online_node), _worker(deployment, online_node)
    for worker in (alive, dead):
        worker_start(worker_id=worker.id, node_name="local")
        worker.refresh_from_db()
        cleanup_processes.append(launch.handle_of(worker))
    Worker.objects.filter(id__in=[alive.id, dead.id]).update(status=WorkerStatus.READY)
    processes.signal_group(launch.handle_of(dead), signal.SIGKILL)
    assert processes.wait_exit(launch.handle_of(dead), 30)

    outcome = node_adopt(node=online_node)

    assert outcome["adopted"] == [alive.id] and outcome["stopped"] == [dead.id]
    assert Worker.objects.get(id=alive.id).status == WorkerStatus.READY
    dead.refresh_from_db()
    assert dead.status == WorkerStatus.STOPPED and "was gone when node agent local started" in dead.last_error


def test_a_recycled_pid_is_not_adopted(deployment, online_node, fake_worker_argv, cleanup_processes):
    import os
    from django.utils import timezone

    # Our own pid is alive, but it is not this worker's process (other create time, no marker).
    impostor = _worker(deployment, online_node, status=WorkerStatus.READY, pid=os.getpid(),
                       started_at=timezone.now())
    assert node_adopt(node=online_node)["stopped"] == [impostor.id]


def test_a_start_that_never_spawned_goes_back_to_pending(deployment, online_node):
    claimed = _worker(deployment, online_node, status=WorkerStatus.STARTING)
    assert node_adopt(node=online_node)["requeued"] == [claimed.id]
    assert Worker.objects.get(id=claimed.id).status == WorkerStatus.PENDING
