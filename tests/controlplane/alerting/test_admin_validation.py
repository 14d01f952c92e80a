"""Django admin edits go through the same validation as the API: a broken rule or silence is refused by the
admin's form, and a good one is accepted."""
import json
from datetime import timedelta

import pytest
from django.forms.models import model_to_dict
from django.utils import timezone

from controlplane.alerting.admin import AlertRuleForm, SilenceForm
from controlplane.alerting.models import AlertRule


def _rule_data(deployment, **changes) -> dict:
    rule = AlertRule(name="kv-high", deployment=deployment, role="decode", metric="kv_cache_usage_ratio",
                     comparison=">", threshold=0.9, actions=[{"type": "scale", "direction": "up", "step": 1}])
    data = {k: v for k, v in model_to_dict(rule).items() if v is not None}
    for field in ("labels", "annotations", "actions"):
        data[field] = json.dumps(data[field])
    data.update(changes)
    return data


def test_the_admin_form_refuses_a_broken_rule(quiet_deployment):
    form = AlertRuleForm(data=_rule_data(quiet_deployment, actions='[{"type": "restart"}]'))
    assert not form.is_valid()
    assert "per-worker" in str(form.errors)


def test_the_admin_form_accepts_a_good_rule(quiet_deployment):
    form = AlertRuleForm(data=_rule_data(quiet_deployment))
    assert form.is_valid(), form.errors
    assert form.save().name == "kv-high"


@pytest.mark.django_db
def test_the_admin_form_refuses_a_broken_silence():
    now = timezone.now()
    form = SilenceForm(data={"matchers": '[{"name": "role", "value": "(", "is_regex": true}]', "comment": "x",
                             "starts_at": now, "ends_at": now + timedelta(hours=1)})
    assert not form.is_valid()
    assert "not a valid regex" in str(form.errors["matchers"])


@pytest.mark.django_db
def test_the_admin_form_refuses_a_silence_that_ends_before_it_starts():
    now = timezone.now()
    form = SilenceForm(data={"matchers": '[{"name": "role", "value": "decode"}]', "comment": "x",
                             "starts_at": now, "ends_at": now - timedelta(hours=1)})
    assert not form.is_valid() and "ends_at must be after starts_at" in str(form.errors["ends_at"])
