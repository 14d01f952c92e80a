"""Alerts page: firing, pending and recently resolved alerts; silencing one (operators); rules (admins edit)."""
from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting.models import Alert, AlertRule, Silence

pytestmark = pytest.mark.django_db


@pytest.fixture
def rule(deployment):
    return AlertRule.objects.create(name="e2e-p99-high", deployment=deployment, role="decode",
                                    metric="e2e_p99_seconds", comparison=">", threshold=0.5, severity="critical")


def _alert(rule, state, *, fingerprint, ago_s=60, **fields):
    now = timezone.now()
    return Alert.objects.create(
        rule=rule, fingerprint=fingerprint, deployment=rule.deployment, role="decode", state=state, value=0.8,
        labels={"alertname": rule.name, "deployment": "demo", "role": "decode", "severity": "critical"},
        active_at=now - timedelta(seconds=ago_s), last_true_at=now, last_evaluated_at=now, **fields)


def test_it_shows_firing_pending_and_recently_resolved_alerts_but_not_old_ones(client_for, viewer, rule):
    now = timezone.now()
    firing = _alert(rule, "firing", fingerprint="a", fired_at=now)
    pending = _alert(rule, "pending", fingerprint="b")
    resolved = _alert(rule, "resolved", fingerprint="c", fired_at=now - timedelta(hours=1), resolved_at=now)
    old = _alert(rule, "resolved", fingerprint="d", fired_at=now - timedelta(days=3),
                 resolved_at=now - timedelta(days=2))
    text = client_for(viewer).get("/alerts/").content.decode()
    firing_part = text.split('id="firing"')[1].split('id="pending"')[0]
    pending_part = text.split('id="pending"')[1].split('id="resolved"')[0]
    resolved_part = text.split('id="resolved"')[1].split('id="silences"')[0]
    assert f'data-alert="{firing.pk}"' in firing_part and f'data-alert="{pending.pk}"' in pending_part
    assert "avg(e2e_p99_seconds[60s]) &gt; 0.5" in firing_part
    assert resolved.resolved_at.strftime("%Y-%m-%d %H:%M:%S") in resolved_part
    assert old.resolved_at.strftime("%Y-%m-%d %H:%M:%S") not in resolved_part


def test_an_operator_silences_an_alert_for_a_duration_with_a_comment(client_for, operator, rule):
    alert = _alert(rule, "firing", fingerprint="a", fired_at=timezone.now())
    response = client_for(operator).post(f"/alerts/{alert.pk}/silence",
                                         {"duration_s": "3600", "comment": "known: deploying a fix"}, follow=True)
    silence = Silence.objects.get()
    assert silence.comment == "known: deploying a fix" and silence.created_by == operator
    assert timedelta(minutes=59) < silence.ends_at - silence.starts_at <= timedelta(hours=1)
    assert {"name": "alertname", "value": "e2e-p99-high", "is_regex": False, "is_equal": True} in silence.matchers
    text = response.content.decode()
    assert "Silenced e2e-p99-high" in text and "known: deploying a fix" in text
    assert 'title="known: deploying a fix">until' in text  # the alert now shows it is silenced


def test_a_silence_without_a_comment_or_with_an_odd_duration_is_a_message(client_for, operator, rule):
    alert = _alert(rule, "firing", fingerprint="a", fired_at=timezone.now())
    client = client_for(operator)
    for data in ({"duration_s": "3600", "comment": ""}, {"duration_s": "42", "comment": "x"}):
        response = client.post(f"/alerts/{alert.pk}/silence", data, follow=True)
        assert response.status_code == 200 and "The silence was not created" in response.content.decode()
    assert not Silence.objects.exists()


def test_an_operator_expires_a_silence(client_for, operator, rule):
    silence = Silence.objects.create(matchers=[{"name": "deployment", "value": "demo"}], comment="x",
                                     ends_at=timezone.now() + timedelta(hours=1))
    client_for(operator).post(f"/silences/{silence.pk}/expire")
    silence.refresh_from_db()
    assert not silence.is_active()


def test_viewers_cannot_silence_or_expire(client_for, viewer, rule):
    alert = _alert(rule, "firing", fingerprint="a", fired_at=timezone.now())
    silence = Silence.objects.create(matchers=[{"name": "deployment", "value": "demo"}], comment="x",
                                     ends_at=timezone.now() + timedelta(hours=1))
    client = client_for(viewer)
    assert client.post(f"/alerts/{alert.pk}/silence", {"duration_s": "900", "comment": "x"}).status_code == 403
    assert client.post(f"/silences/{silence.pk}/expire").status_code == 403
    assert Silence.objects.count() == 1 and Silence.objects.get().is_active()


RULE = {"name": "qps-drop", "deployment": "demo", "role": "", "metric": "qps", "aggregation": "avg",
        "window_s": "300", "comparison": "<", "threshold": "0.7", "compare_to_offset_s": "3600", "for_s": "120",
        "keep_firing_for_s": "0", "severity": "warning", "cooldown_s": "300", "enabled": "on",
        "actions": '[{"type": "notify"}]', "labels": "{}", "annotations": '{"summary": "QPS down 30%"}'}


def test_an_admin_creates_and_edits_a_rule(client_for, admin, deployment):
    client = client_for(admin)
    response = client.post("/alerts/rules/new", RULE, follow=True)
    rule = AlertRule.objects.get(name="qps-drop")
    assert (rule.compare_to_offset_s, rule.threshold, rule.actions) == (3600, 0.7, [{"type": "notify"}])
    assert "Alert rule qps-drop saved" in html.unescape(response.content.decode())
    client.post(f"/alerts/rules/{rule.pk}/", {**RULE, "threshold": "0.5", "enabled": ""})
    rule.refresh_from_db()
    assert rule.threshold == 0.5 and not rule.enabled


def test_invalid_rules_are_shown_with_the_services_message(client_for, admin, deployment):
    client = client_for(admin)
    response = client.post("/alerts/rules/new", {**RULE, "actions": '[{"type": "restart"}]'})
    assert response.status_code == 400
    assert "restart needs a per-worker rule" in html.unescape(response.content.decode())
    response = client.post("/alerts/rules/new", {**RULE, "actions": "[oops"})
    assert response.status_code == 400 and "not valid JSON" in response.content.decode()
    assert not AlertRule.objects.filter(name="qps-drop").exists()


def test_operators_and_viewers_read_rules_but_cannot_save_them(client_for, operator, viewer, rule):
    for user in (operator, viewer):
        client = client_for(user)
        page = client.get(f"/alerts/rules/{rule.pk}/").content.decode()
        assert "Read-only: admins create and edit alert rules." in page and "Save rule" not in page
        assert client.post(f"/alerts/rules/{rule.pk}/", {**RULE, "name": "hijack"}).status_code == 403
        assert client.post("/alerts/rules/new", RULE).status_code == 403
    rule.refresh_from_db()
    assert rule.name == "e2e-p99-high"


def test_after_a_silence_the_page_returns_only_to_a_local_address(client_for, operator, rule):
    alert = _alert(rule, "firing", fingerprint="a", fired_at=timezone.now())
    client = client_for(operator)
    response = client.post(f"/alerts/{alert.pk}/silence", {"duration_s": "900", "comment": "x",
                                                           "next": "https://evil.example/phish"})
    assert response["Location"] == "/alerts/"
    response = client.post(f"/alerts/{alert.pk}/silence", {"duration_s": "900", "comment": "y",
                                                           "next": "/alerts/?deployment=demo"})
    assert response["Location"] == "/alerts/?deployment=demo"


def test_alert_values_carry_the_unit_of_their_metric(client_for, viewer, rule, deployment):
    now = timezone.now()
    _alert(rule, "firing", fingerprint="a", fired_at=now)  # e2e P99 of 0.8 s
    ratio_rule = AlertRule.objects.create(name="errors", deployment=deployment, role="gateway",
                                          metric="error_ratio", comparison=">", threshold=0.01)
    errors = _alert(ratio_rule, "firing", fingerprint="b", fired_at=now)
    Alert.objects.filter(pk=errors.pk).update(value=0.125)
    firing = client_for(viewer).get("/alerts/").content.decode().split('id="firing"')[1].split('id="pending"')[0]
    assert '<td class="num">800 ms</td>' in firing and '<td class="num">12.5%</td>' in firing
