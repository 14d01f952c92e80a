"""RevisionSample moves to the observability app, which writes it: removed from this app's state only. Its table
(rollouts_revisionsample) stays as it is, rows and indexes included; observability 0004 takes it over by name."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0002_revision_samples'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='RevisionSample')],
            database_operations=[],
        ),
    ]
