"""A deployment's autoscaler mode and budget, and the advice the autoscaler records in advisory mode."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('autoscaling', '0002_policy_queue_wait_target'),
        ('controlplane', '0021_action_kind_fault'),
    ]

    operations = [
        migrations.CreateModel(
            name='DeploymentAutoscaling',
            fields=[
                ('deployment', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='controlplane.deployment')),
                ('mode', models.CharField(choices=[('active', 'Active'), ('advisory', 'Advisory')], default='active', max_length=16)),
                ('max_workers', models.PositiveIntegerField(blank=True, null=True)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name='ScaleAdvice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('from_replicas', models.PositiveIntegerField()),
                ('to_replicas', models.PositiveIntegerField()),
                ('metric', models.CharField(max_length=40)),
                ('observed', models.FloatField(blank=True, null=True)),
                ('target', models.FloatField()),
                ('ratio', models.FloatField(blank=True, null=True)),
                ('raw', models.IntegerField(blank=True, null=True)),
                ('inputs', models.JSONField(blank=True, default=dict)),
                ('reason', models.TextField()),
                ('status', models.CharField(choices=[('open', 'Open'), ('applied', 'Applied'), ('superseded', 'Superseded')], default='open', max_length=16)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('evaluated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('num_evaluations', models.PositiveIntegerField(default=1)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.TextField(blank=True)),
                ('applied_by', models.CharField(blank=True, max_length=150)),
                ('action', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='controlplane.action')),
                ('pool', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='controlplane.pool')),
            ],
            options={
                'indexes': [models.Index(fields=['pool', '-created_at'], name='advice_pool_newest'), models.Index(condition=models.Q(('status', 'open')), fields=['pool'], name='advice_open')],
            },
        ),
    ]
