"""Switching the autoscaler and silencing alerts are operator decisions: each leaves a row in the audit log."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting.services.silences import silence_create, silence_expire
from controlplane.autoscaling.services import autoscaling_update
from controlplane.models import Action, ActionStatus

pytestmark = pytest.mark.django_db


def test_turning_the_autoscaler_on_writes_an_action_naming_who_and_what(deployment, operator):
    autoscaling_update(deployment=deployment, actor=operator, enabled=True)
    action = Action.objects.get(kind="autoscale")
    assert action.deployment == deployment and action.actor == operator.username
    assert action.status == ActionStatus.SUCCEEDED and action.finished_at is not None
    assert "autoscaler on" in action.reason


def test_a_change_that_changes_nothing_writes_no_action(deployment, operator):
    autoscaling_update(deployment=deployment, actor=operator, enabled=deployment.autoscale_enabled)
    assert not Action.objects.filter(kind="autoscale").exists()


def test_creating_and_expiring_a_silence_each_write_an_action(deployment, operator):
    silence = silence_create(matchers=[{"name": "deployment", "value": deployment.name}],
                             ends_at=timezone.now() + timedelta(hours=1), comment="maintenance", created_by=operator)
    silence_expire(silence=silence, actor=operator)
    created, expired = Action.objects.filter(kind="silence").order_by("id")
    assert created.deployment == deployment and "created" in created.reason and "maintenance" in created.reason
    assert expired.actor == operator.username and "expired" in expired.reason
