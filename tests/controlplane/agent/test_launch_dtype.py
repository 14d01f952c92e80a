"""A worker is launched with its revision's dtype (`auto` passed as is: the worker resolves it where the model is),
or its role's own where the revision's engine settings give one,
boolean engine settings become bare flags, and a new process starts with no reported dtype."""
from __future__ import annotations

from controlplane.agent import launch
from controlplane.agent.workers import worker_start
from controlplane.models import Revision, Worker, WorkerStatus
from inference.worker.config import parse_args


def _revision(deployment, **fields) -> Revision:
    current = deployment.current_revision
    number = deployment.revisions.count() + 1
    return Revision.objects.create(deployment=deployment, number=number, model_path=current.model_path, **fields)


def _worker_argv(deployment, node, revision) -> list[str]:
    worker = Worker(deployment=deployment, role="decode", node=node, id=99, revision=revision)
    argv = launch.argv_for(worker, 1234)
    return argv[argv.index("inference.worker") + 1:]


def test_the_revisions_dtype_reaches_the_worker_and_auto_is_resolved_there(deployment, online_node):
    assert deployment.current_revision.dtype == "auto"
    argv = _worker_argv(deployment, online_node, deployment.current_revision)
    assert argv[argv.index("--dtype") + 1] == "auto"
    assert parse_args(argv).engine.dtype == "auto"
    pinned = _worker_argv(deployment, online_node, _revision(deployment, dtype="float32"))
    assert parse_args(pinned).engine.dtype == "float32"


def test_a_roles_own_dtype_overrides_the_revisions_for_that_role_only(deployment, online_node):
    revision = _revision(deployment, dtype="auto", engine_settings={"common": {}, "prefill": {"dtype": "float32"}})
    argv = _worker_argv(deployment, online_node, revision)  # a decode worker: the revision's
    assert parse_args(argv).engine.dtype == "auto"
    prefill = Worker(deployment=deployment, role="prefill", node=online_node, id=98, revision=revision)
    argv = launch.argv_for(prefill, 1235)
    argv = argv[argv.index("inference.worker") + 1:]
    assert argv.count("--dtype") == 1 and parse_args(argv).engine.dtype == "float32"


def test_a_true_boolean_setting_is_a_bare_flag_and_a_false_one_is_left_out(deployment, online_node):
    forced = _worker_argv(deployment, online_node, _revision(
        deployment, dtype="float16", engine_settings={"allow_slow_float16": True, "threads": 1}))
    assert "--allow-slow-float16" in forced and "True" not in forced
    assert parse_args(forced).engine.allow_slow_float16 is True
    plain = _worker_argv(deployment, online_node, _revision(
        deployment, dtype="float16", engine_settings={"allow_slow_float16": False}))
    assert "--allow-slow-float16" not in plain and "False" not in plain
    assert parse_args(plain).engine.allow_slow_float16 is False


def test_a_restarted_process_reports_its_dtype_anew(deployment, online_node, fake_worker_argv, cleanup_processes):
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=online_node,
                                   status=WorkerStatus.PENDING, dtype="bfloat16")
    assert worker_start(worker_id=worker.id, node_name=online_node.name) == "started"
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    assert worker.status == WorkerStatus.STARTING and worker.dtype == ""
