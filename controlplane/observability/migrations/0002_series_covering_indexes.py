"""The series indexes carry the columns a series read aggregates (PostgreSQL: INCLUDE), so that the dashboard's
reads are index-only scans instead of one heap page per row.

The new indexes are built before the old ones are dropped, so that reads keep an index while they build; scrapes
wait for each build (CREATE INDEX holds off writes to its table): about half a minute per 10 M rows on two cores.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('observability', '0001_initial'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='rollup',
            index=models.Index(fields=['deployment_id', 'metric', 'role', 'worker_id', 'ts'],
                               include=('avg', 'min', 'max', 'count'), name='rollup_series_cover'),
        ),
        migrations.AddIndex(
            model_name='sample',
            index=models.Index(fields=['deployment_id', 'metric', 'role', 'worker_id', 'ts'], include=('value',),
                               name='sample_series_cover'),
        ),
        migrations.RemoveIndex(
            model_name='rollup',
            name='rollup_series',
        ),
        migrations.RemoveIndex(
            model_name='sample',
            name='sample_series',
        ),
    ]
