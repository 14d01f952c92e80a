from django.db import migrations, models


def fill_deployments(apps, schema_editor):
    """A cursor of a per-deployment gateway is its deployment's; one whose gateway row is gone is dropped (the pull
    prunes those anyway)."""
    TraceCursor = apps.get_model("replay", "TraceCursor")
    Worker = apps.get_model("controlplane", "Worker")
    owners = dict(Worker.objects.filter(deployment__isnull=False).values_list("id", "deployment_id"))
    for cursor in TraceCursor.objects.all():
        if cursor.gateway_id in owners:
            cursor.deployment_id = owners[cursor.gateway_id]
            cursor.save(update_fields=["deployment_id"])
        else:
            cursor.delete()


class Migration(migrations.Migration):

    dependencies = [
        ('replay', '0001_initial'),
        ('controlplane', '0023_worker_shared_gateway'),
    ]

    operations = [
        migrations.AddField(
            model_name='tracecursor',
            name='deployment_id',
            field=models.BigIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.RunPython(fill_deployments, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='tracecursor',
            name='gateway_id',
            field=models.BigIntegerField(),
        ),
        migrations.AddConstraint(
            model_name='tracecursor',
            constraint=models.UniqueConstraint(fields=('gateway_id', 'deployment_id'), name='trace_cursor_unique'),
        ),
    ]
