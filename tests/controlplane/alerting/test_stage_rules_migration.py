"""Migrations controlplane 0010 + alerting 0002: a deployment that existed before them gets the default objectives
and the per-stage default rules (roles by its mode, thresholds from its objectives); its end-to-end P99 rule moves to
the objective only where it still has the old built-in 0.5 s."""
from __future__ import annotations

import pytest

from tests.controlplane.migrations import migrations_restored

BEFORE = [("controlplane", "0008_node_labels_pool_placement"), ("alerting", "0001_initial")]
AFTER = [("alerting", "0002_stage_default_rules")]


@pytest.mark.django_db(transaction=True)
def test_existing_deployments_get_objectives_and_the_stage_rules():
    with migrations_restored() as migrate:
        old = migrate(BEFORE)
        Deployment = old.get_model("controlplane", "Deployment")
        OldRule = old.get_model("alerting", "AlertRule")
        split = Deployment.objects.create(name="split", mode="disaggregated", gateway_port=18011)
        single = Deployment.objects.create(name="single", mode="colocated", gateway_port=18012)
        # What the defaults wrote before: an untouched e2e rule, and one an operator tightened.
        for deployment, threshold in ((split, 0.5), (single, 0.3)):
            OldRule.objects.create(name=f"{deployment.name}:p99-latency", deployment=deployment, role="gateway",
                                   metric="e2e_p99_seconds", aggregation="last", comparison=">",
                                   threshold=threshold, default_key="p99-latency")

        new = migrate(AFTER)
        Rule = new.get_model("alerting", "AlertRule")
        assert new.get_model("controlplane", "Deployment").objects.get(pk=split.pk).objectives == {
            "ttft_p99_seconds": 10.0, "itl_p99_seconds": 1.0, "e2e_p99_seconds": 60.0}
        rules = {(r.deployment_id, r.default_key): r for r in Rule.objects.all()}
        assert (rules[(split.pk, "prefill-ttft")].role, rules[(split.pk, "prefill-ttft")].threshold) == ("prefill", 10.0)
        assert (rules[(split.pk, "decode-itl")].role, rules[(split.pk, "decode-itl")].threshold) == ("decode", 1.0)
        assert rules[(single.pk, "decode-itl")].role == "colocated"
        assert rules[(single.pk, "kv-usage")].actions[0] == {"type": "scale", "direction": "up", "step": 1}
        assert rules[(split.pk, "decode-tokens-drop")].compare_to_offset_s == 3600
        assert rules[(split.pk, "p99-latency")].threshold == 60.0
        assert rules[(single.pk, "p99-latency")].threshold == 0.3  # an operator's value stays
        assert Rule.objects.count() == 2 + 2 * 4
