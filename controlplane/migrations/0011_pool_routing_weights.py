from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0010_deployment_objectives'),
    ]

    operations = [
        migrations.AddField(
            model_name='pool',
            name='routing_weights',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
