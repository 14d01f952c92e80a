"""TANDEM_METRICS_BACKEND=prometheus with a Prometheus that does not answer: the loops hold still (no alert
transition, no scale on missing data), /healthz is degraded and names Prometheus, and Tandem does not scrape."""
import time
from datetime import datetime, timezone

import pytest

from controlplane.alerting.models import Alert, AlertTransition
from controlplane.alerting.services.evaluation import evaluate_rules
from controlplane.alerting.services.rules import rule_create
from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Action, Pool
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample
from controlplane.observability.tasks import scrape_cycle_task
from tests.procs import free_port


@pytest.fixture
def dead_prometheus(settings):
    """Switches the backend to a Prometheus URL where nothing listens (call it once the embedded reads are done)."""
    def switch() -> str:
        url = f"http://127.0.0.1:{free_port()}"
        settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", url
        settings.TANDEM_PROMETHEUS_TIMEOUT_S = 1
        return url
    return switch


def sample(deployment, metric, value, *, role="decode", at):
    Sample.objects.create(ts=at, deployment_id=deployment.pk, role=role, worker_id=None, metric=METRIC_IDS[metric],
                          value=value)


def test_a_firing_alert_neither_resolves_nor_moves_while_prometheus_is_unreachable(deployment, dead_prometheus):
    from controlplane.alerting.models import AlertRule

    AlertRule.objects.filter(deployment=deployment).delete()
    rule_create(deployment=deployment, name="kv-full", role="decode", metric="kv_cache_usage_ratio",
                aggregation="last", window_s=60, comparison=">", threshold=0.9, cooldown_s=0)
    now = time.time()
    sample(deployment, "kv_cache_usage_ratio", 0.95, at=now - 1)
    evaluate_rules(now=datetime.fromtimestamp(now, tz=timezone.utc))
    assert Alert.objects.get().state == "firing"

    url = dead_prometheus()
    # Two minutes on: the embedded store has no sample in the window any more (which would resolve the alert);
    # with Prometheus unreachable the evaluator must not read that as "no longer holds".
    report = evaluate_rules(now=datetime.fromtimestamp(now + 120, tz=timezone.utc))
    assert report.held.startswith(f"Prometheus at {url} did not answer")
    assert report.transitions == []
    assert Alert.objects.get().state == "firing"
    assert AlertTransition.objects.filter(to_state="resolved").count() == 0


def test_the_autoscaler_does_not_scale_while_prometheus_is_unreachable(deployment, make_worker, dead_prometheus):
    deployment.autoscale_enabled = True
    deployment.save()
    make_worker(deployment, "decode")
    sample(deployment, "itl_p99_seconds", 0.3, at=time.time() - 1)  # 3x the target: embedded would scale to 3
    url = dead_prometheus()
    pool = Pool.objects.select_related("deployment").get(deployment=deployment, role="decode")
    assert autoscale_pool(pool, now=time.time()) is None
    assert not Action.objects.filter(deployment=deployment, kind="scale").exists()
    assert Pool.objects.get(pk=pool.pk).desired_replicas == 1
    assert AutoscalingPolicy.objects.get(pool=pool).last_decision.startswith(f"held: Prometheus at {url}")


def test_healthz_is_degraded_and_names_prometheus(db, client, dead_prometheus):
    url = dead_prometheus()
    body = client.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["metrics_backend"]["name"] == "prometheus"
    assert body["metrics_backend"]["state"].startswith(f"Prometheus at {url} unreachable")
    assert any(p.startswith(f"Prometheus at {url} unreachable") and "hold still" in p for p in body["problems"])
    assert "scrape" not in body["control_loops"]  # Tandem runs no scrape pass in this mode


def test_healthz_of_the_embedded_backend_says_nothing_of_prometheus(db, client):
    body = client.get("/healthz").json()
    assert body["metrics_backend"] == {"name": "embedded", "state": "ok"}
    assert "scrape" in body["control_loops"]


def test_tandem_does_not_scrape_in_prometheus_mode(deployment, make_worker, dead_prometheus):
    make_worker(deployment, "decode", port=free_port())
    dead_prometheus()
    assert scrape_cycle_task() == {"skipped": "TANDEM_METRICS_BACKEND=prometheus: Prometheus scrapes"}
    assert not Sample.objects.exists()
