"""The autoscaler's policy table, created by observability 0001 and written only by this app, becomes this app's
model: added to the state only (db_table keeps the observability app's name), so no table is created, renamed or
copied. No foreign key points at it; its own to controlplane.Pool is unchanged."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('controlplane', '0013_rollouts'),
        ('observability', '0005_autoscaling_policy_to_autoscaling'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AutoscalingPolicy',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name='ID')),
                        ('enabled', models.BooleanField(default=True)),
                        ('metric', models.CharField(choices=[
                            ('ttft_p99_seconds', 'Ttft P99'), ('itl_p99_seconds', 'Itl P99'),
                            ('e2e_p99_seconds', 'E2E P99'), ('requests_waiting_per_worker', 'Waiting Per Worker'),
                            ('requests_running_per_worker', 'Running Per Worker'),
                            ('kv_cache_usage_ratio', 'Kv Cache Usage')], max_length=40)),
                        ('target', models.FloatField()),
                        ('recommendations', models.JSONField(blank=True, default=list)),
                        ('resumed_at', models.DateTimeField(blank=True, null=True)),
                        ('last_evaluated_at', models.DateTimeField(blank=True, null=True)),
                        ('last_decision', models.TextField(blank=True)),
                        ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('pool', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                                      related_name='autoscaling', to='controlplane.pool')),
                    ],
                    options={
                        'db_table': 'observability_autoscalingpolicy',
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
