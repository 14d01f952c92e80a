"""Included at the project root by controlplane/urls.py: `path("", include("controlplane.observability.urls"))`."""
from django.urls import path

from controlplane.observability.api import (GrafanaDashboardView, MetricsQueryView, PrometheusRulesView,
                                           PrometheusScrapeTokenView, PrometheusTargetsView)
from controlplane.observability.metrics_view import metrics

urlpatterns = [
    path("metrics", metrics, name="controlplane-metrics"),
    path("api/v1/metrics/query", MetricsQueryView.as_view(), name="metrics-query"),
    path("api/v1/prometheus/targets", PrometheusTargetsView.as_view(), name="prometheus-targets"),
    path("api/v1/prometheus/rules.yml", PrometheusRulesView.as_view(), name="prometheus-rules"),
    path("api/v1/prometheus/scrape-token", PrometheusScrapeTokenView.as_view(), name="prometheus-scrape-token"),
    path("api/v1/deployments/<str:name>/grafana.json", GrafanaDashboardView.as_view(), name="grafana-dashboard"),
]
