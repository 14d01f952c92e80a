"""AutoscalingPolicy moves to the autoscaling app, which writes it: removed from this app's state only. Its table
(observability_autoscalingpolicy) stays as it is; autoscaling 0001 takes it over by name."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('observability', '0004_revision_sample_from_rollouts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='AutoscalingPolicy')],
            database_operations=[],
        ),
    ]
