"""Revision engine settings get per-role parts: {"common": {...}, <role>: {...}}. Stored flat dicts move into
common (what they meant: every worker got them). Reversing flattens common back, and refuses (naming them) while
a revision has per-role parts, which the flat shape cannot hold. Also: deployments' sampling defaults."""

from django.db import migrations, models

ROLES = ("prefill", "decode", "colocated")


def _is_per_role(settings: dict) -> bool:
    return "common" in settings or bool(set(settings) & set(ROLES))


def flat_into_common(apps, schema_editor):
    Revision = apps.get_model("controlplane", "Revision")
    # QuerySet.update: Revision.save refuses changes to a stored revision (immutability of what it runs, which
    # this does not change).
    for pk, settings in Revision.objects.values_list("pk", "engine_settings"):
        settings = settings or {}
        if not _is_per_role(settings):
            Revision.objects.filter(pk=pk).update(engine_settings={"common": settings})


def common_back_to_flat(apps, schema_editor):
    Revision = apps.get_model("controlplane", "Revision")
    rows = list(Revision.objects.values_list("pk", "deployment__name", "number", "engine_settings"))
    per_role = [f"{name}#{number}" for _, name, number, settings in rows
                if any((settings or {}).get(role) for role in ROLES)]
    if per_role:
        raise RuntimeError(f"revisions {per_role} have per-role engine settings, which the flat shape before "
                           "0009 cannot hold; delete those revisions (or their deployments) first")
    for pk, _, _, settings in rows:
        settings = settings or {}
        if _is_per_role(settings):
            Revision.objects.filter(pk=pk).update(engine_settings=dict(settings.get("common") or {}))


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0008_node_labels_pool_placement'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='sampling_defaults',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AlterField(
            model_name='action',
            name='kind',
            field=models.CharField(choices=[('create', 'Create'), ('delete', 'Delete'), ('scale', 'Scale'), ('restart', 'Restart'), ('drain', 'Drain'), ('rollback', 'Rollback'), ('revision', 'Revision'), ('notify', 'Notify'), ('start', 'Start'), ('stop', 'Stop'), ('fail', 'Fail'), ('autoscale', 'Autoscale'), ('silence', 'Silence'), ('unschedulable', 'Unschedulable'), ('label', 'Label'), ('placement', 'Placement'), ('sampling', 'Sampling')], max_length=20),
        ),
        migrations.RunPython(flat_into_common, common_back_to_flat),
    ]
