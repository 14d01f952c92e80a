"""The default control-loop rule: fires when a periodic pass of the control plane (reconcile, health, scrape, alert
evaluation) has not run for its stale limit; stepped by the web process's watchdog (alerting.services.watchdog).
The spec is copied as it was when this migration was written: later edits of the live default must not change what
it did."""
from django.db import migrations

CONTROL_LOOP_RULE = {
    "name": "control-plane:control-loop-stale", "default_key": "control-loop-stale",
    "metric": "control_loop_staleness_ratio", "aggregation": "last", "window_s": 60, "comparison": ">",
    "threshold": 1.0, "for_s": 0, "severity": "critical", "actions": [{"type": "notify"}], "cooldown_s": 0,
    "annotations": {"summary": "The control plane's {{ $labels.loop }} pass has not run for {{ $value }} × its "
                               "stale limit (5 intervals): is the broker, Celery beat or the control worker down?"},
}


def add_control_loop_rule(apps, schema_editor):
    AlertRule = apps.get_model("alerting", "AlertRule")
    if not AlertRule.objects.filter(name=CONTROL_LOOP_RULE["name"]).exists():
        AlertRule.objects.create(**CONTROL_LOOP_RULE)


def remove_control_loop_rule(apps, schema_editor):
    AlertRule = apps.get_model("alerting", "AlertRule")
    AlertRule.objects.filter(default_key=CONTROL_LOOP_RULE["default_key"], deployment=None).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('alerting', '0004_rule_tenant'),
    ]

    operations = [
        migrations.RunPython(add_control_loop_rule, remove_control_loop_rule),
    ]
