"""The per-stage default rules for deployments that existed before them (new deployments get them from
alerting.services.defaults), and the end-to-end P99 rule moved to the deployment's objective where it still has the
old built-in threshold (0.5 s, which a CPU demo never meets). The specs are copied here as they were when this
migration was written: later edits of the live defaults must not change what it did."""
from django.db import migrations

NOTIFY_ALL = {"type": "notify"}
SCALE_UP = {"type": "scale", "direction": "up", "step": 1}
DEFAULT_OBJECTIVES = {"ttft_p99_seconds": 10.0, "itl_p99_seconds": 1.0, "e2e_p99_seconds": 60.0}
OLD_E2E_THRESHOLD = 0.5

STAGE_RULES = (
    {"key": "prefill-ttft", "metric": "ttft_p99_seconds", "stage": "prefill", "aggregation": "last",
     "window_s": 60, "comparison": ">", "objective": "ttft_p99_seconds", "for_s": 60, "actions": [NOTIFY_ALL],
     "summary": "P99 time to first token of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} s, "
                "over its objective"},
    {"key": "decode-itl", "metric": "itl_p99_seconds", "stage": "decode", "aggregation": "last", "window_s": 60,
     "comparison": ">", "objective": "itl_p99_seconds", "for_s": 60, "actions": [NOTIFY_ALL],
     "summary": "P99 inter-token latency of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} s, "
                "over its objective"},
    {"key": "decode-tokens-drop", "metric": "generation_tokens_per_second", "stage": "decode", "aggregation": "avg",
     "window_s": 600, "compare_to_offset_s": 3600, "comparison": "<", "threshold": 0.7, "for_s": 300,
     "actions": [NOTIFY_ALL],
     "summary": "Generated tokens/s of the {{ $labels.role }} pool of {{ $labels.deployment }} are {{ $value }} × "
                "their level an hour ago (down more than 30%)"},
    {"key": "kv-usage", "metric": "kv_cache_usage_ratio", "role": "", "aggregation": "min", "window_s": 60,
     "comparison": ">", "threshold": 0.9, "for_s": 300, "actions": [SCALE_UP, NOTIFY_ALL],
     "summary": "KV cache of the {{ $labels.role }} pool of {{ $labels.deployment }} is {{ $value }} used (> 90% for "
                "5 minutes)"},
)


def add_stage_rules(apps, schema_editor):
    Deployment = apps.get_model("controlplane", "Deployment")
    AlertRule = apps.get_model("alerting", "AlertRule")
    for deployment in Deployment.objects.all():
        objectives = {**DEFAULT_OBJECTIVES, **(deployment.objectives or {})}
        have = set(AlertRule.objects.filter(deployment=deployment).values_list("default_key", flat=True))
        rules = []
        for spec in STAGE_RULES:
            if spec["key"] in have:
                continue
            role = spec.get("role", "")
            if "stage" in spec:
                role = spec["stage"] if deployment.mode == "disaggregated" else "colocated"
            threshold = objectives[spec["objective"]] if "objective" in spec else spec["threshold"]
            rules.append(AlertRule(
                name=f"{deployment.name}:{spec['key']}", deployment=deployment, default_key=spec["key"], role=role,
                metric=spec["metric"], aggregation=spec["aggregation"], window_s=spec["window_s"],
                comparison=spec["comparison"], threshold=threshold,
                compare_to_offset_s=spec.get("compare_to_offset_s"), for_s=spec["for_s"], severity="warning",
                actions=spec["actions"], annotations={"summary": spec["summary"]}, cooldown_s=300))
        AlertRule.objects.bulk_create(rules, ignore_conflicts=True)
        AlertRule.objects.filter(deployment=deployment, default_key="p99-latency",
                                 threshold=OLD_E2E_THRESHOLD).update(
            threshold=objectives["e2e_p99_seconds"],
            annotations={"summary": "P99 end-to-end latency of {{ $labels.deployment }} is {{ $value }} s, over its "
                                    "objective"})


def remove_stage_rules(apps, schema_editor):
    AlertRule = apps.get_model("alerting", "AlertRule")
    AlertRule.objects.filter(default_key__in=[spec["key"] for spec in STAGE_RULES]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("alerting", "0001_initial"),
        ("controlplane", "0010_deployment_objectives"),
    ]

    operations = [migrations.RunPython(add_stage_rules, remove_stage_rules)]
