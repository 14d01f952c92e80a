from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0018_action_kind_hold'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='engines',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
