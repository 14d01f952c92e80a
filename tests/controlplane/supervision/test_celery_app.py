"""Beat runs reconcile and health on the periodic queue every TANDEM_RECONCILE_INTERVAL_S, apart from the reconcile a
change asks for (control queue), which a backlog of passes must not delay; agent tasks have no
fixed queue (they are always sent to a node's queue); tasks sent by name are registered in every process."""
from __future__ import annotations

import pytest

from controlplane.agent import tasks as agent_tasks
from controlplane.celery import app, task_send
from controlplane.supervision import tasks as supervision_tasks


def test_beat_schedules_reconcile_and_health_on_the_periodic_queue_every_interval(settings):
    schedule = {name: entry for name, entry in app.conf.beat_schedule.items()
                if name in ("reconcile-all", "check-health")}
    assert {entry["task"] for entry in schedule.values()} == {supervision_tasks.reconcile_all.name,
                                                              supervision_tasks.check_health.name}
    for entry in schedule.values():
        assert entry["schedule"] == float(settings.TANDEM_RECONCILE_INTERVAL_S)
        assert entry["options"] == {"queue": "periodic", "expires": float(settings.TANDEM_RECONCILE_INTERVAL_S)}


def test_control_tasks_route_to_control_and_agent_tasks_are_not_routed_by_name():
    routes = app.conf.task_routes
    assert routes[supervision_tasks.reconcile_deployment.name] == {"queue": "control"}
    assert routes[supervision_tasks.reconcile_all.name] == routes[supervision_tasks.check_health.name] == {
        "queue": "periodic"}
    assert agent_tasks.agent_start_worker.name not in routes and agent_tasks.agent_stop_worker.name not in routes
    assert all(task.ignore_result for task in (supervision_tasks.reconcile_all, supervision_tasks.check_health,
                                               agent_tasks.agent_start_worker))


def test_every_task_is_named_after_the_module_that_runs_it():
    for task in (supervision_tasks.reconcile_deployment, supervision_tasks.reconcile_all,
                 supervision_tasks.check_health, agent_tasks.agent_start_worker, agent_tasks.agent_stop_worker):
        assert app.tasks[task.name] is task._get_current_object()  # shared_task gives a proxy
        assert task.name.rpartition(".")[0] == task.run.__module__


def test_task_send_sends_the_registered_task_with_its_queue(monkeypatch):
    calls = []
    monkeypatch.setattr(agent_tasks.agent_stop_worker, "apply_async",
                        lambda args=(), **options: calls.append((tuple(args), options)))
    task_send(agent_tasks.agent_stop_worker.name, args=(7, 2.0), queue="node.a")
    assert calls == [((7, 2.0), {"queue": "node.a"})]
    with pytest.raises(KeyError):
        task_send("controlplane.no_such_task")


def test_a_start_task_that_raised_hands_its_worker_to_the_restart_policy(deployment, online_node, sent):
    from controlplane.models import Action, Worker, WorkerStatus

    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=online_node,
                                   status=WorkerStatus.STARTING)
    agent_tasks.agent_start_worker.on_failure(OSError("disk full"), "task-id", (worker.id,), {}, None)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING
    assert "the node agent failed to start it: OSError('disk full')" in Action.objects.get(kind="restart").reason


def test_every_beat_entry_goes_to_the_periodic_queue_and_the_control_worker_consumes_both(tmp_path):
    from controlplane.run.stack import child_specs

    assert {entry["options"]["queue"] for entry in app.conf.beat_schedule.values()} == {"periodic"}
    specs = child_specs(web_port=8000, node_name="n", var_dir=tmp_path)
    control = next(spec for spec in specs if spec.name == "control")
    assert control.argv[control.argv.index("--queues") + 1] == "control,periodic"
