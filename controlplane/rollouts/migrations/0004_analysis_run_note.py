from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0003_revision_sample_to_observability'),
    ]

    operations = [
        migrations.AddField(
            model_name='analysisrun',
            name='note',
            field=models.TextField(blank=True),
        ),
    ]
