"""A control loop that stopped running fires the control-loop alert from the web process's /healthz probes (no
beat, broker or Celery worker involved): once however many probes and web processes step it, delivered to a
webhook channel from the web process itself, resolved once the loop runs again. The evaluator pass leaves it alone."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from controlplane.alerting.models import Alert, AlertRule, AlertState, Delivery, DeliveryStatus
from controlplane.alerting.services import watchdog
from controlplane.alerting.services.channels import channel_create
from controlplane.alerting.services.evaluation import evaluate_rules
from controlplane.alerting.services.rules import rule_create
from controlplane.observability import healthz as health
from controlplane.errors import ControlPlaneError
from controlplane.models import Action
from controlplane.observability.models import CycleStat
from controlplane.observability.telemetry import cycle_freshness, record_cycle

# No test transaction: the deliveries are sent after commit, from a thread with its own database connection.
pytestmark = pytest.mark.django_db(transaction=True)
LOOPS = ("reconcile", "health", "scrape", "alert_evaluation")


def wait_for(condition, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def bodies(receiver) -> list[dict]:
    return [json.loads(r["body"]) for r in receiver.requests]


@pytest.fixture
def rule(monkeypatch):
    """The default rule: migration 0005's row, or (after an earlier test's flush removed it) the same made through
    the service. Every probe steps it (no per-process throttle)."""
    monkeypatch.setattr(watchdog, "WATCHDOG_INTERVAL_S", 0.0)
    monkeypatch.setattr(health, "STARTED", time.time())
    monkeypatch.setattr(health, "_broker_cache", None)
    for kind in LOOPS:
        record_cycle(kind, 0.01)
    spec = watchdog.CONTROL_LOOP_RULE
    return AlertRule.objects.filter(name=spec["name"]).first() or rule_create(**spec)


@pytest.fixture
def hook(receiver):
    channel_create(name="ops", kind="webhook", url=receiver.url, secrets=["s3cret"])
    return receiver


def stop_reconcile():
    CycleStat.objects.filter(kind="reconcile").update(last_at=timezone.now() - timedelta(minutes=10))


def test_a_stale_loop_fires_once_across_probes_reaches_the_webhook_and_resolves_when_it_runs_again(
        rule, hook, anon_api, viewer):
    for _ in range(3):
        assert anon_api.get("/healthz").json()["status"] == "ok"
    assert not Alert.objects.exists()

    stop_reconcile()
    for _ in range(5):
        body = anon_api.get("/healthz").json()
        assert body["status"] == "degraded" and body["control_loops"]["reconcile"]["stale"]
    alert = Alert.objects.get()
    assert alert.state == AlertState.FIRING and alert.deployment is None
    assert alert.labels == {"alertname": "control-plane:control-loop-stale", "severity": "critical",
                            "loop": "reconcile"}
    assert alert.value >= 19  # 600 s over a 30 s limit (less a little for a slow machine)
    assert "reconcile pass has not run" in alert.annotations["summary"]
    notify = Action.objects.get(kind="notify")  # the audit log says who told whom
    assert notify.actor_type == "rule" and "no reconcile pass for 600 s" in notify.reason
    wait_for(lambda: Delivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 1)
    fired = bodies(hook)
    assert len(fired) == 1 and fired[0]["event"] == "firing"
    assert fired[0]["alert"]["labels"]["loop"] == "reconcile"
    assert "Tandem-Signature" in hook.requests[0]["headers"]

    for _ in range(3):
        anon_api.get("/healthz")
    assert Alert.objects.count() == Action.objects.filter(kind="notify").count() == Delivery.objects.count() == 1
    page = Client()
    page.force_login(viewer)
    html = page.get("/alerts/").content.decode()
    assert "control-plane:control-loop-stale" in html and "reconcile loop" in html

    record_cycle("reconcile", 0.01)
    assert anon_api.get("/healthz").json()["status"] == "ok"
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolved_at is not None
    wait_for(lambda: Delivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2)
    for _ in range(3):
        anon_api.get("/healthz")
    assert [b["event"] for b in bodies(hook)] == ["firing", "resolved"]


def test_web_processes_stepping_it_at_once_fire_it_once(rule, hook):
    stop_reconcile()
    freshness = cycle_freshness(time.time())
    start = threading.Barrier(4)
    errors = []

    def web_process():
        try:
            start.wait(10)
            watchdog.control_loops_check(freshness=freshness)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=web_process) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert Alert.objects.filter(state=AlertState.FIRING).count() == 1
    assert Action.objects.filter(kind="notify").count() == 1
    wait_for(lambda: Delivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 1)
    assert len(hook.requests) == 1


def test_the_evaluator_pass_leaves_control_loop_alerts_to_the_watchdog(rule):
    stop_reconcile()
    watchdog.control_loops_check(freshness=cycle_freshness(time.time()))
    record_cycle("reconcile", 0.01)  # fresh again, but only a probe may say so
    report = evaluate_rules()
    assert report.num_rules == 0
    assert Alert.objects.get().state == AlertState.FIRING


def test_an_admin_edits_it_like_any_rule_and_a_disabled_one_fires_nothing(rule, anon_api, admin_api):
    response = admin_api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"threshold": 2, "enabled": False}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["condition"] == "control_loop_staleness_ratio{loop} > 2"
    stop_reconcile()
    assert anon_api.get("/healthz").json()["status"] == "degraded"
    assert not Alert.objects.exists()


def test_a_probe_answers_when_the_watchdog_cannot_write(rule, anon_api):
    stop_reconcile()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA query_only = ON" if connection.vendor == "sqlite"
                       else "SET SESSION default_transaction_read_only = on")
    try:
        response = anon_api.get("/healthz")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA query_only = OFF" if connection.vendor == "sqlite"
                           else "SET SESSION default_transaction_read_only = off")
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    assert not Alert.objects.exists()


@pytest.mark.parametrize("field, value", [("role", "decode"), ("per_worker", True), ("compare_to_offset_s", 60),
                                          ("actions", [{"type": "scale", "direction": "up"}])])
def test_a_control_loop_rule_has_no_deployment_scope(field, value):
    fields = {**watchdog.CONTROL_LOOP_RULE, "name": "loops", field: value}
    with pytest.raises(ControlPlaneError) as refused:
        rule_create(**fields)
    assert refused.value.status == 400 and refused.value.extra["field"].startswith(field)
