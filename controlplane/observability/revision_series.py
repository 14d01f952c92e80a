"""Reads of the per-revision series (RevisionSample: the gateway's request series split by the revision that
served): points over a range, for the rollout and A/B pages' overlaid charts, through observability.reader.

Kept at raw retention only, like the tenant series: a rollout older than TANDEM_METRICS_RAW_RETENTION_S (6 h by
default) charts no points. The Prometheus backend answers the same read from the `tandem_revision:` recording rules
(recording_rules.REVISION_METRICS).
"""
from __future__ import annotations

from django.db.models import Count, F, FloatField, Sum
from django.db.models.functions import Cast, Floor

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import RevisionSample
from controlplane.observability.series import _rows


def revision_series_range(*, deployment_id: int, revisions: list[int], metrics: list[str], start: float, end: float,
                          step: float) -> dict[tuple[int, str], list[list[float]]]:
    """(revision, metric) → [[ts, mean of the samples in [ts, ts + step)], ...] of the deployment's revisions in
    [start, end): one grouped query for every revision and metric; a series without samples is absent."""
    names = {METRIC_IDS[metric]: metric for metric in metrics if metric in METRIC_IDS}
    if not names or not revisions:
        return {}
    bucket = Cast(Floor((F("ts") - start) / step), output_field=FloatField())
    queryset = (RevisionSample.objects.filter(deployment_id=deployment_id, revision__in=list(revisions),
                                              metric__in=sorted(names), ts__gte=start, ts__lt=end)
                .annotate(bucket=bucket).values("revision", "metric", "bucket")
                .annotate(total=Sum("value"), weight=Count("*"))
                .order_by("revision", "metric", "bucket")
                .values_list("revision", "metric", "bucket", "total", "weight"))
    found: dict[tuple[int, str], list[list[float]]] = {}
    for revision, metric, index, total, weight in _rows(queryset):
        if weight:
            found.setdefault((revision, names[metric]), []).append([start + int(index) * step, total / weight])
    return found
