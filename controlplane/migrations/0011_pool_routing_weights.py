from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0008_node_labels_pool_placement'),
    ]

    operations = [
        migrations.AddField(
            model_name='pool',
            name='routing_weights',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
