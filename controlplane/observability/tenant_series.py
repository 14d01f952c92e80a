"""Reads of the per-tenant series (TenantSample): one value per deployment over a window (alert rules scoped to a
tenant, through observability.reader) and points over a range (the tenant page's charts).

Tenant series are kept at raw retention only (TANDEM_METRICS_RAW_RETENTION_S, 6 h by default) and never rolled
up: a window or range older than that has no data. A tenant has rows only while it uses a deployment
(tenant_rates.py), so a silent deployment is absent rather than None, unless the read names it.
"""
from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, F, FloatField, Sum
from django.db.models.functions import Cast, Floor

from controlplane.models import Deployment
from controlplane.observability.catalog import METRIC_IDS, TENANT_METRICS
from controlplane.observability.models import TenantSample
from controlplane.observability.series import AGGREGATIONS, MetricValue, _aggregate, _rows, as_unix

TENANT_ROLE = "gateway"  # the role a tenant's values carry: they are what its deployment's gateways measured


def check_tenant_read(metric: str, aggregation: str, window_s: float) -> None:
    if metric not in TENANT_METRICS:
        raise ValueError(f"metric {metric!r} is not stored per tenant; per tenant: {', '.join(TENANT_METRICS)}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")


def tenant_metric_values(*, metric: str, tenant: str, deployments: list[int] | None = None,
                         aggregation: str = "avg", window_s: float = 60, offset_s: float = 0,
                         now=None) -> list[MetricValue]:
    """One value per deployment of `tenant`'s series over (now - offset_s - window_s, now - offset_s]: of the
    deployments in `deployments` (None: every deployment), those with samples in the window. Raises ValueError for
    a metric not stored per tenant (callers validate their input first)."""
    check_tenant_read(metric, aggregation, window_s)
    end = as_unix(now) - float(offset_s)
    filters = {"tenant": tenant, "metric": METRIC_IDS[metric], "ts__gt": end - float(window_s), "ts__lte": end}
    if deployments is not None:
        filters["deployment_id__in"] = list(deployments)
    grouped: dict[int, list[float]] = defaultdict(list)
    for deployment_id, value in (TenantSample.objects.filter(**filters).order_by("ts")
                                 .values_list("deployment_id", "value")):
        grouped[deployment_id].append(value)
    names = dict(Deployment.objects.filter(pk__in=list(grouped)).values_list("id", "name"))
    return [MetricValue(deployment_id=dep, deployment_name=names.get(dep, ""), role=TENANT_ROLE, worker_id=None,
                        value=_aggregate(aggregation, values), num_samples=len(values))
            for dep, values in sorted(grouped.items())]


def tenant_series_range(*, tenant: str, metrics: list[str], start: float, end: float,
                        step: float) -> dict[str, list[dict]]:
    """metric → [{"deployment_id", "points": [[ts, mean of the samples in [ts, ts + step)], ...]}] of the tenant's
    series in [start, end): one grouped query for every metric and deployment."""
    names = {METRIC_IDS[metric]: metric for metric in metrics if metric in TENANT_METRICS}
    if not names:
        return {}
    bucket = Cast(Floor((F("ts") - start) / step), output_field=FloatField())
    queryset = (TenantSample.objects.filter(tenant=tenant, metric__in=sorted(names), ts__gte=start, ts__lt=end)
                .annotate(bucket=bucket).values("metric", "deployment_id", "bucket")
                .annotate(total=Sum("value"), weight=Count("*"))
                .order_by("metric", "deployment_id", "bucket")
                .values_list("metric", "deployment_id", "bucket", "total", "weight"))
    by_metric: dict[str, dict[int, list]] = defaultdict(dict)
    for metric, deployment_id, index, total, weight in _rows(queryset):
        points = by_metric[names[metric]].setdefault(deployment_id, [])
        if weight:
            points.append([start + int(index) * step, total / weight])
    return {metric: [{"deployment_id": dep, "points": points} for dep, points in sorted(series.items())]
            for metric, series in by_metric.items()}
