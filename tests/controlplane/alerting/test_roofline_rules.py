"""The roofline default rules, evaluated for real over stored series: a stage that runs below a fraction of its
host's roofline (prefill 20% of the matmul peak, decode 5% of the bandwidth limit) for 5 minutes fires, on that
stage's pool; a stage without figures (an unmeasured host) never does."""
from __future__ import annotations

from tests.controlplane.alerting.test_stage_default_rules import alert_of, stage_rules


def test_each_roofline_rule_reads_its_stages_pool_in_either_mode(deployment, make_deployment):
    from controlplane.alerting.models import AlertRule

    rules = stage_rules(deployment, "prefill-roofline", "decode-roofline")
    prefill, decode = rules["prefill-roofline"], rules["decode-roofline"]
    assert prefill.describe() == "max(prefill_roofline_ratio[60s]) < 0.2" and prefill.role == "prefill"
    assert decode.describe() == "max(decode_roofline_ratio[60s]) < 0.05" and decode.role == "decode"
    assert prefill.for_s == decode.for_s == 300
    together = AlertRule.objects.filter(deployment=make_deployment("one", mode="colocated"),
                                        default_key__in=("prefill-roofline", "decode-roofline"))
    assert {rule.role for rule in together} == {"colocated"}


def test_prefill_below_a_fifth_of_its_peak_for_5_minutes_fires(deployment, write_sample, evaluate, at):
    rule = stage_rules(deployment, "prefill-roofline")["prefill-roofline"]
    for second in range(0, 300, 15):
        write_sample(deployment, "prefill", "prefill_roofline_ratio", 0.04, at(second))  # bfloat16 without BF16
        write_sample(deployment, "decode", "prefill_roofline_ratio", 0.01, at(second))  # not this stage's pool
        evaluate(at(second))
    assert (alert_of(rule).state, alert_of(rule).role) == ("pending", "prefill")
    write_sample(deployment, "prefill", "prefill_roofline_ratio", 0.04, at(300))
    evaluate(at(300))
    alert = alert_of(rule)
    assert (alert.state, alert.value) == ("firing", 0.04)
    assert "of its host's matmul peak" in alert.annotations["summary"]


def test_a_stage_at_its_usual_share_does_not_fire(deployment, write_sample, evaluate, at):
    rules = stage_rules(deployment, "prefill-roofline", "decode-roofline")
    for second in range(0, 601, 30):
        write_sample(deployment, "prefill", "prefill_roofline_ratio", 0.55, at(second))
        write_sample(deployment, "decode", "decode_roofline_ratio", 0.15, at(second))
        evaluate(at(second))
    assert alert_of(rules["prefill-roofline"]) is None and alert_of(rules["decode-roofline"]) is None


def test_a_stage_without_figures_never_fires(deployment, evaluate, at):
    rules = stage_rules(deployment, "prefill-roofline", "decode-roofline")
    for second in range(0, 601, 60):
        evaluate(at(second))
    assert alert_of(rules["prefill-roofline"]) is None and alert_of(rules["decode-roofline"]) is None
