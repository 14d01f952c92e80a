"""RevisionSample, written by this app's scrape cycle, becomes this app's model: added to the state only, on the
table that rollouts 0002 created (db_table keeps its name), so no table is created, renamed or copied."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('observability', '0003_cycle_shard_targets'),
        ('rollouts', '0003_revision_sample_to_observability'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='RevisionSample',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name='ID')),
                        ('ts', models.FloatField()),
                        ('deployment_id', models.BigIntegerField()),
                        ('revision', models.PositiveIntegerField()),
                        ('metric', models.PositiveSmallIntegerField()),
                        ('value', models.FloatField()),
                    ],
                    options={
                        'db_table': 'rollouts_revisionsample',
                        'indexes': [
                            models.Index(fields=['deployment_id', 'revision', 'metric', 'ts'],
                                         name='revision_sample_series'),
                            models.Index(fields=['ts'], name='revision_sample_ts'),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
