"""A revision's `quantization` reaches its workers as --quantization, and a new process reports its weights anew."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.agent.workers import worker_start
from controlplane.models import Revision, Worker, WorkerStatus
from inference.worker.config import parse_args


def test_the_revisions_quantization_becomes_the_worker_flag(deployment, online_node):
    current = deployment.current_revision
    revision = Revision.objects.create(deployment=deployment, number=2, model_path=current.model_path,
                                       engine_settings={"quantization": "int8"})
    worker = Worker(deployment=deployment, role="decode", node=online_node, id=99, revision=revision)
    argv = launch.argv_for(worker, 1234)
    argv = argv[argv.index("inference.worker") + 1:]
    assert argv[argv.index("--quantization") + 1] == "int8"
    assert parse_args(argv).engine.quantization == "int8"
    plain = Worker(deployment=deployment, role="decode", node=online_node, id=98, revision=current)
    assert "--quantization" not in launch.argv_for(plain, 1234)


def test_a_restarted_process_reports_its_weights_anew(deployment, online_node, fake_worker_argv, cleanup_processes):
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=online_node,
                                   status=WorkerStatus.PENDING, quantization="int8", weight_bytes=123)
    assert worker_start(worker_id=worker.id, node_name=online_node.name) == "started"
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    assert worker.status == WorkerStatus.STARTING
    assert (worker.quantization, worker.weight_bytes) == ("", None)
