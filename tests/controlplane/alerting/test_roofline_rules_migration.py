"""Migration alerting 0003: a deployment that existed before it gets the two roofline default rules (roles by its
mode); one that already has a rule of that key keeps it."""
from __future__ import annotations

import pytest

from tests.controlplane.migrations import migrations_restored

BEFORE = [("alerting", "0002_stage_default_rules")]
AFTER = [("alerting", "0003_roofline_default_rules")]


@pytest.mark.django_db(transaction=True)
def test_existing_deployments_get_the_roofline_rules():
    with migrations_restored() as migrate:
        old = migrate(BEFORE)
        Deployment = old.get_model("controlplane", "Deployment")
        split = Deployment.objects.create(name="split", mode="disaggregated", gateway_port=18021)
        single = Deployment.objects.create(name="single", mode="colocated", gateway_port=18022)
        old.get_model("alerting", "AlertRule").objects.create(
            name="single:decode-roofline", deployment=single, role="colocated", metric="decode_roofline_ratio",
            aggregation="max", comparison="<", threshold=0.01, default_key="decode-roofline")

        Rule = migrate(AFTER).get_model("alerting", "AlertRule")
        rules = {(r.deployment_id, r.default_key): r for r in Rule.objects.all()}
        assert (rules[(split.pk, "prefill-roofline")].role, rules[(split.pk, "prefill-roofline")].threshold) == (
            "prefill", 0.2)
        assert (rules[(split.pk, "decode-roofline")].role, rules[(split.pk, "decode-roofline")].for_s) == (
            "decode", 300)
        assert rules[(single.pk, "prefill-roofline")].role == "colocated"
        assert rules[(single.pk, "decode-roofline")].threshold == 0.01  # an operator's value stays
