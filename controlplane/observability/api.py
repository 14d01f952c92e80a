"""REST API of the observability app: GET /api/v1/metrics/query, the stored series of one metric."""
from __future__ import annotations

import math
import re
import time

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from controlplane.api.params import parse_time
from controlplane.api.serializers import ErrorSerializer
from controlplane.api.views.base import ERRORS, READ_ERRORS, ApiView
from controlplane.errors import ControlPlaneError, invalid
from controlplane.observability.catalog import METRICS, UNITS
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.recording_rules import rules_file
from controlplane.observability.series import MAX_POINTS, SeriesQuery, auto_step
from controlplane.selectors import deployment_get

ROLES = ("prefill", "decode", "colocated", "gateway")
_WORKER_ID = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also admits '²', which int() refuses


def parse_query(params, *, now: float) -> tuple[SeriesQuery, object]:
    metric = params.get("metric")
    if not metric:
        raise invalid(f"metric is required; known metrics: {', '.join(METRICS)}", field="metric")
    if metric not in METRICS:
        raise invalid(f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)}", field="metric")
    name = params.get("deployment")
    if not name:
        raise invalid("deployment is required (a deployment name)", field="deployment")
    deployment = deployment_get(name)
    role = params.get("role") or None
    if role is not None and role not in ROLES:
        raise invalid(f"role {role!r} is not one of {', '.join(ROLES)}", field="role")
    worker = params.get("worker") or None
    if worker not in (None, "all"):
        if not _WORKER_ID.fullmatch(worker) or not 0 < int(worker) < 2**63:
            raise invalid(f"worker must be a worker id or 'all', not {worker!r}", field="worker")
        worker = int(worker)
    end = parse_time(params["end"], "end") if params.get("end") else now
    start = parse_time(params["start"], "start") if params.get("start") else end - 3600
    if start >= end:
        raise invalid(f"start ({start:.0f}) must be before end ({end:.0f})", field="start")
    oldest = now - settings.TANDEM_METRICS_ROLLUP_RETENTION_S
    if end < oldest:
        raise invalid(f"the range ends before the oldest kept data (rollups are kept "
                      f"{settings.TANDEM_METRICS_ROLLUP_RETENTION_S} s)", field="end")
    if params.get("step"):
        try:
            step = float(params["step"])
        except ValueError:
            raise invalid(f"step={params['step']!r} is not a number of seconds", field="step") from None
        if not math.isfinite(step) or step < 1:
            raise invalid(f"step must be at least 1 second, not {params['step']}", field="step")
    else:
        step = auto_step(start, end)
    num_points = (end - start) / step
    if num_points > MAX_POINTS:
        raise invalid(f"{num_points:.0f} points per series exceed the limit of {MAX_POINTS}: raise step or "
                      f"shorten the range", field="step")
    return SeriesQuery(metric=metric, deployment_id=deployment.pk, role=role, worker=worker, start=start, end=end,
                       step=step), deployment


class SeriesSerializer(serializers.Serializer):
    deployment = serializers.CharField()
    role = serializers.CharField()
    worker_id = serializers.IntegerField(allow_null=True, help_text="null: the pool aggregate")
    points = serializers.ListField(child=serializers.ListField(child=serializers.FloatField()),
                                   help_text="[[unix seconds, value], ...]; a point is the mean over [t, t + step)")


class SeriesResponseSerializer(serializers.Serializer):
    metric = serializers.CharField()
    unit = serializers.CharField()
    deployment = serializers.CharField()
    start = serializers.FloatField()
    end = serializers.FloatField()
    step = serializers.FloatField()
    source = serializers.ChoiceField(choices=["raw", "rollup", "prometheus"])
    series = SeriesSerializer(many=True)


def _query_parameter(name: str, description: str, required: bool = False) -> OpenApiParameter:
    return OpenApiParameter(name, str, OpenApiParameter.QUERY, required=required, description=description)


class MetricsQueryView(ApiView):
    """GET /api/v1/metrics/query?metric=&deployment=&role=&worker=&start=&end=&step= (viewer and up).

    `worker` absent: the pool aggregates (one series per role); `worker=all`: one series per worker; `worker=<id>`:
    that worker. start/end: Unix seconds or ISO 8601 (default: the last hour); step: seconds (default: ~300 points).
    """

    @extend_schema(
        parameters=[
            _query_parameter("metric", f"One of: {', '.join(METRICS)}", required=True),
            _query_parameter("deployment", "Deployment name", required=True),
            _query_parameter("role", "prefill, decode, colocated or gateway; default: every role"),
            _query_parameter("worker", "absent: pool aggregates; `all`: one series per worker; an id: that worker"),
            _query_parameter("start", "Unix seconds or ISO 8601; default: end − 1 h"),
            _query_parameter("end", "Unix seconds or ISO 8601; default: now"),
            _query_parameter("step", "Seconds per point; default: about 300 points"),
        ],
        responses={200: SeriesResponseSerializer, **ERRORS, 503: ErrorSerializer},
        description="Stored series of one metric over a time range (viewer), from the metrics backend: with the "
                    "embedded one, raw samples for ranges up to 2 h inside raw retention, 1-minute rollups "
                    "otherwise; with Prometheus, a query_range over Tandem's recording rules. 503 when the "
                    "backend does not answer.")
    def get(self, request):
        now = time.time()
        query, deployment = parse_query(request.query_params, now=now)
        try:
            source, series = reader().query_range([query], now=now)[0]
        except MetricsUnavailable as exc:
            raise ControlPlaneError(str(exc), status=503, code="metrics_unavailable") from None
        for item in series:
            item["deployment"] = deployment.name
            del item["deployment_id"]
        return Response({"metric": query.metric, "unit": UNITS[query.metric], "deployment": deployment.name,
                         "start": query.start, "end": query.end, "step": query.step, "source": source,
                         "series": series})


class PrometheusTargetsView(ApiView):
    """GET /api/v1/prometheus/targets (viewer and up): every worker and gateway Tandem scrapes, as Prometheus HTTP
    service discovery, for a Prometheus that scrapes the fleet itself (docs/prometheus.md)."""

    @extend_schema(responses={200: dict, **ERRORS},
                   description="Prometheus http_sd_configs targets: [{targets, labels: {deployment, pool, revision, "
                               "node, worker}}]; a worker's also `engine`, a shared gateway's group (one per "
                               "deployment it serves) `shared_gateway` and `__param_deployment`.")
    def get(self, request):
        from controlplane.observability.prometheus import sd_targets

        return Response(sd_targets())


class PrometheusRulesView(ApiView):
    """GET /api/v1/prometheus/rules.yml (viewer and up): the recording rules that the `prometheus` metrics backend
    reads, as `manage.py tandem_recording_rules` writes them for the configured window and interval, so that an
    operator's Prometheus (or a sidecar that fills its `rule_files`) can fetch them from the control plane rather
    than from a file copied by hand (docs/prometheus.md)."""

    @extend_schema(operation_id="v1_prometheus_rules_retrieve", responses={(200, "application/yaml"): str, **ERRORS},
                   description="The Prometheus recording rules file (YAML) of the `prometheus` metrics backend.")
    def get(self, request):
        text = rules_file(window_s=settings.TANDEM_SCRAPE_WINDOW_S, interval_s=settings.TANDEM_SCRAPE_INTERVAL_S)
        response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = 'inline; filename="tandem.yml"'
        return response


class PrometheusScrapeTokenView(ApiView):
    """GET /api/v1/prometheus/scrape-token (viewer and up): the token a gateway asks of whoever reads its /metrics
    (inference/gateway/operator_views.py), for the `authorization` of a Prometheus scrape job (docs/prometheus.md).
    Viewers read what it shows (tenants and their usage, the workers' addresses) through this API already."""

    @extend_schema(operation_id="v1_prometheus_scrape_token_retrieve",
                   responses={(200, "text/plain"): str, **READ_ERRORS},
                   description="The gateways' scrape token (text), for a Prometheus scrape job's credentials_file.")
    def get(self, request):
        from controlplane.lib.worker_keys import scrape_token

        return HttpResponse(scrape_token(), content_type="text/plain; charset=utf-8")


class GrafanaDashboardView(ApiView):
    """GET /api/v1/deployments/{name}/grafana.json (viewer and up): the deployment page's panels as a Grafana
    dashboard over Prometheus (the labels of /api/v1/prometheus/targets), to import into Grafana."""

    @extend_schema(responses={200: dict, **ERRORS}, description="An importable Grafana dashboard (JSON).")
    def get(self, request, name: str):
        from controlplane.observability.prometheus import grafana_dashboard

        deployment = deployment_get(name)  # 404 naming it when there is none
        response = Response(grafana_dashboard(deployment.name))
        response["Content-Disposition"] = f'attachment; filename="tandem-{deployment.name}-grafana.json"'
        return response
