from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0019_node_engines'),
    ]

    operations = [
        migrations.AddField(
            model_name='revision',
            name='model_checksum',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
    ]
