from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0015_action_kind_tenant'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='roofline',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
