"""The autoscaler's Celery task: beat runs it every scrape interval on the periodic queue, and one run evaluates
every pool once and records its duration for the control plane's own /metrics."""
from controlplane.autoscaling.tasks import autoscale_cycle_task
from controlplane.observability.models import CycleKind, CycleStat


def test_beat_runs_the_autoscaler_every_scrape_interval_on_the_periodic_queue(settings):
    from controlplane.celery import app

    entry = app.conf.beat_schedule["autoscaling-evaluate"]
    assert entry["task"] == "autoscaling.autoscale_cycle"
    assert "autoscaling.autoscale_cycle" in app.tasks
    assert entry["schedule"] == float(settings.TANDEM_SCRAPE_INTERVAL_S)
    assert entry["options"]["queue"] == "periodic"
    assert app.conf.task_routes["autoscaling.autoscale_cycle"] == {"queue": "periodic"}
    assert "observability-scrape" in app.conf.beat_schedule  # the other entries are kept, not replaced


def test_a_run_evaluates_each_pool_and_records_its_duration(deployment):
    deployment.autoscale_enabled = True
    deployment.save()
    result = autoscale_cycle_task()
    assert (result["pools"], result["num_scaled"]) == (2, 0)  # prefill and decode, no data: no change
    assert CycleStat.objects.get(kind=CycleKind.AUTOSCALE).count == 1
