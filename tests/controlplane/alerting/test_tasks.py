"""The Celery side: beat schedules the evaluation pass on the periodic queue, and the task runs one pass and records
its duration for the control plane's own /metrics."""
import pytest


def test_beat_runs_the_evaluation_every_interval_on_the_periodic_queue(settings):
    from controlplane.celery import app

    entry = app.conf.beat_schedule["alerting-evaluate"]
    assert entry["task"] == "controlplane.alerting.tasks.evaluate_rules_task"
    assert entry["schedule"] == float(settings.TANDEM_ALERT_EVAL_INTERVAL_S)
    assert entry["options"]["queue"] == "periodic"
    assert "reconcile-all" in app.conf.beat_schedule  # the core schedule is kept, not replaced
    assert "controlplane.alerting.tasks.evaluate_rules_task" in app.tasks


def test_the_task_evaluates_and_records_the_pass(quiet_deployment, make_rule, write_sample):
    from django.utils import timezone

    from controlplane.alerting.models import Alert
    from controlplane.alerting.tasks import evaluate_rules_task
    from controlplane.observability.models import CycleStat

    make_rule(quiet_deployment)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, timezone.now())
    result = evaluate_rules_task.apply().get()
    assert result["rules"] == 1 and result["transitions"] == 1
    assert Alert.objects.get().state == "firing"
    assert CycleStat.objects.get(kind="alert_evaluation").count == 1


def test_the_sweep_resends_deliveries_left_pending(quiet_deployment, make_rule, write_sample, eager_celery):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.alerting import tasks
    from controlplane.alerting.models import Channel, Delivery
    from controlplane.alerting.services.evaluation import evaluate_rules
    from tests.procs import free_port

    Channel.objects.create(name="ops", kind="webhook", url=f"http://127.0.0.1:{free_port()}/nobody")
    make_rule(quiet_deployment, actions=[{"type": "notify"}])
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, timezone.now())
    evaluate_rules()  # its on-commit enqueue never runs inside the test's transaction: as if the task were lost
    assert tasks.deliveries_sweep_task() == 0  # just queued: its own task may still be on the way
    # Tried 10 s ago and still pending: whoever tries it (a retry, the web process's watchdog thread) owns it.
    Delivery.objects.update(created_at=timezone.now() - timedelta(minutes=5),
                            last_attempt_at=timezone.now() - timedelta(seconds=10))
    assert tasks.deliveries_sweep_task() == 0
    Delivery.objects.update(last_attempt_at=timezone.now() - timedelta(minutes=3))
    assert tasks.deliveries_sweep_task() == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 3)
    assert "connection failed" in delivery.error
    assert tasks.deliveries_sweep_task() == 0


@pytest.fixture
def eager_celery():
    """Run tasks in this process (nothing reaches the shared broker folder)."""
    from controlplane.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before
