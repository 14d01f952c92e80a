"""Beat runs reconcile and health on the control queue every TANDEM_RECONCILE_INTERVAL_S; agent tasks have no
fixed queue (they are always sent to a node's queue)."""
from __future__ import annotations

from controlplane import tasks
from controlplane.celery import app


def test_beat_schedules_reconcile_and_health_on_the_control_queue_every_interval(settings):
    schedule = {name: entry for name, entry in app.conf.beat_schedule.items()
                if name in ("reconcile-all", "check-health")}
    assert {entry["task"] for entry in schedule.values()} == {"controlplane.tasks.reconcile_all",
                                                              "controlplane.tasks.check_health"}
    for entry in schedule.values():
        assert entry["schedule"] == float(settings.TANDEM_RECONCILE_INTERVAL_S)
        assert entry["options"] == {"queue": "control", "expires": float(settings.TANDEM_RECONCILE_INTERVAL_S)}


def test_control_tasks_route_to_control_and_agent_tasks_are_not_routed_by_name():
    routes = app.conf.task_routes
    assert routes[tasks.reconcile_deployment.name] == {"queue": "control"}
    assert tasks.agent_start_worker.name not in routes and tasks.agent_stop_worker.name not in routes
    assert all(task.ignore_result for task in (tasks.reconcile_all, tasks.check_health, tasks.agent_start_worker))


def test_a_start_task_that_raised_hands_its_worker_to_the_restart_policy(deployment, online_node, sent):
    from controlplane.models import Action, Worker, WorkerStatus

    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=online_node,
                                   status=WorkerStatus.STARTING)
    tasks.agent_start_worker.on_failure(OSError("disk full"), "task-id", (worker.id,), {}, None)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING
    assert "the node agent failed to start it: OSError('disk full')" in Action.objects.get(kind="restart").reason
