"""Every new deployment gets the default rules, editable like any other."""


def test_a_new_deployment_gets_the_default_rules(deployment):
    from controlplane.alerting.models import AlertRule

    rules = {r.default_key: r for r in AlertRule.objects.filter(deployment=deployment)}
    assert set(rules) == {"p99-latency", "gpu-utilization", "gpu-memory", "error-ratio", "server-error-ratio",
                          "qps-drop", "worker-down", "unschedulable", "prefill-ttft", "decode-itl",
                          "decode-tokens-drop", "kv-usage", "prefill-roofline", "decode-roofline"}
    p99 = rules["p99-latency"]
    assert (p99.metric, p99.role, p99.comparison, p99.threshold) == ("e2e_p99_seconds", "gateway", ">", 60.0)
    gpu = rules["gpu-utilization"]
    assert (gpu.metric, gpu.threshold, gpu.for_s) == ("gpu_utilization_ratio", 0.95, 300)
    assert {"type": "scale", "direction": "up", "step": 1} in gpu.actions
    memory = rules["gpu-memory"]
    assert (memory.metric, memory.threshold, memory.for_s) == ("gpu_memory_used_ratio", 0.9, 300)
    assert {"type": "scale", "direction": "up", "step": 1} in memory.actions
    assert (rules["error-ratio"].metric, rules["error-ratio"].threshold) == ("error_ratio", 0.01)
    assert (rules["server-error-ratio"].metric, rules["server-error-ratio"].threshold) == ("server_error_ratio",
                                                                                           0.005)
    qps = rules["qps-drop"]
    assert (qps.metric, qps.compare_to_offset_s, qps.comparison, qps.threshold) == ("qps", 3600, "<", 0.7)
    down = rules["worker-down"]
    assert (down.metric, down.per_worker, down.comparison, down.threshold) == ("up", True, "<", 1)
    assert down.actions[0] == {"type": "restart"}
    assert all({"type": "notify"} in r.actions for r in rules.values())


def test_the_default_rules_pass_the_rule_validation(deployment):
    from controlplane.alerting.models import AlertRule
    from controlplane.alerting.services.rules import rule_validate

    rules = list(AlertRule.objects.filter(deployment=deployment))
    assert rules
    for rule in rules:
        cleaned = rule_validate({}, instance=rule)  # raises on anything a user could not have written
        assert (cleaned["metric"], cleaned["threshold"]) == (rule.metric, rule.threshold), rule.name


def test_an_admin_edits_a_default_rule(deployment, admin_api):
    from controlplane.alerting.models import AlertRule

    rule = AlertRule.objects.get(deployment=deployment, default_key="p99-latency")
    response = admin_api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"threshold": 0.8, "for_s": 120}, format="json")
    assert response.status_code == 200, response.content
    rule.refresh_from_db()
    assert (rule.threshold, rule.for_s, rule.default_key) == (0.8, 120, "p99-latency")
    assert (rule.deployment_id, rule.role, rule.actions) == (deployment.pk, "gateway", [{"type": "notify"}])


def test_a_second_deployment_gets_its_own_rules(deployment, make_deployment):
    from controlplane.alerting.models import AlertRule

    other = make_deployment("other", mode="colocated")
    assert AlertRule.objects.filter(deployment=other).count() == 14
    assert AlertRule.objects.filter(deployment=deployment).count() == 14
