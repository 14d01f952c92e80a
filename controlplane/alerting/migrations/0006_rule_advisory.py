"""Advisory rules: the switch, and the advice they record instead of acting (models/advice.py)."""
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('alerting', '0005_control_loop_rule'),
        ('controlplane', '0023_worker_shared_gateway'),
    ]

    operations = [
        migrations.AddField(
            model_name='alertrule',
            name='advisory',
            field=models.BooleanField(default=False),
        ),
        migrations.CreateModel(
            name='ActionAdvice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action_index', models.PositiveIntegerField()),
                ('kind', models.CharField(max_length=20)),
                ('params', models.JSONField(default=dict)),
                ('target', models.CharField(max_length=200)),
                ('role', models.CharField(blank=True, default='', max_length=20)),
                ('basis', models.JSONField(default=dict)),
                ('value', models.FloatField(blank=True, null=True)),
                ('comparison', models.CharField(max_length=2)),
                ('threshold', models.FloatField()),
                ('detail', models.TextField(blank=True)),
                ('reason', models.TextField()),
                ('status', models.CharField(choices=[('open', 'Open'), ('applied', 'Applied'), ('superseded', 'Superseded'), ('expired', 'Expired')], default='open', max_length=16)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('evaluated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('num_evaluations', models.PositiveIntegerField(default=1)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.TextField(blank=True)),
                ('applied_by', models.CharField(blank=True, max_length=150)),
                ('action', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='controlplane.action')),
                ('alert', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='advice', to='alerting.alert')),
                ('deployment', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='controlplane.deployment')),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='advice', to='alerting.alertrule')),
                ('worker', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='controlplane.worker')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
                'indexes': [models.Index(fields=['rule', '-created_at'], name='actionadvice_rule_newest'), models.Index(fields=['rule', 'action_index', 'target', 'created_at'], name='actionadvice_cooldown')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('status', 'open')), fields=('rule', 'action_index', 'target'), name='actionadvice_one_open_per_target')],
            },
        ),
    ]
