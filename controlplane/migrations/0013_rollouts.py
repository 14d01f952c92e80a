from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("controlplane", "0012_worker_weights"),
    ]

    operations = [
        migrations.AlterField(
            model_name="action",
            name="kind",
            field=models.CharField(choices=[('create', 'Create'), ('delete', 'Delete'), ('scale', 'Scale'), ('restart', 'Restart'), ('drain', 'Drain'), ('rollback', 'Rollback'), ('revision', 'Revision'), ('notify', 'Notify'), ('start', 'Start'), ('stop', 'Stop'), ('fail', 'Fail'), ('autoscale', 'Autoscale'), ('silence', 'Silence'), ('unschedulable', 'Unschedulable'), ('label', 'Label'), ('placement', 'Placement'), ('sampling', 'Sampling'), ('objectives', 'Objectives'), ('rollout', 'Rollout'), ('promote', 'Promote'), ('abort', 'Abort')], max_length=20),
        ),
    ]
