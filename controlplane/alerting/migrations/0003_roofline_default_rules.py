"""The roofline default rules (each stage below a fraction of its host's roofline) for deployments that existed
before them; new deployments get them from alerting.services.defaults. The specs are copied as they were when this
migration was written: later edits of the live defaults must not change what it did."""
from django.db import migrations

NOTIFY_ALL = {"type": "notify"}

ROOFLINE_RULES = (
    {"key": "prefill-roofline", "metric": "prefill_roofline_ratio", "stage": "prefill", "threshold": 0.2,
     "summary": "Prefill of the {{ $labels.role }} pool of {{ $labels.deployment }} runs at {{ $value }} of its host's "
                "matmul peak (< 20% for 5 minutes): a dtype the CPU does not compute natively, a busy or throttled "
                "host?"},
    {"key": "decode-roofline", "metric": "decode_roofline_ratio", "stage": "decode", "threshold": 0.05,
     "summary": "Decode of the {{ $labels.role }} pool of {{ $labels.deployment }} runs at {{ $value }} of its host's "
                "bandwidth limit (< 5% for 5 minutes): a busy or throttled host, or a batch too large for it?"},
)


def add_roofline_rules(apps, schema_editor):
    Deployment = apps.get_model("controlplane", "Deployment")
    AlertRule = apps.get_model("alerting", "AlertRule")
    for deployment in Deployment.objects.all():
        have = set(AlertRule.objects.filter(deployment=deployment).values_list("default_key", flat=True))
        AlertRule.objects.bulk_create([
            AlertRule(name=f"{deployment.name}:{spec['key']}", deployment=deployment, default_key=spec["key"],
                      role=spec["stage"] if deployment.mode == "disaggregated" else "colocated",
                      metric=spec["metric"], aggregation="max", window_s=60, comparison="<",
                      threshold=spec["threshold"], for_s=300, severity="warning", actions=[NOTIFY_ALL],
                      annotations={"summary": spec["summary"]}, cooldown_s=300)
            for spec in ROOFLINE_RULES if spec["key"] not in have], ignore_conflicts=True)


def remove_roofline_rules(apps, schema_editor):
    AlertRule = apps.get_model("alerting", "AlertRule")
    AlertRule.objects.filter(default_key__in=[spec["key"] for spec in ROOFLINE_RULES]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("alerting", "0002_stage_default_rules"),
    ]

    operations = [migrations.RunPython(add_roofline_rules, remove_roofline_rules)]
