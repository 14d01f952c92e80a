"""Included at the project root by controlplane/urls.py: `path("", include("controlplane.observability.urls"))`."""
from django.urls import path

from controlplane.observability.api import MetricsQueryView
from controlplane.observability.metrics_view import metrics

urlpatterns = [
    path("metrics", metrics, name="controlplane-metrics"),
    path("api/v1/metrics/query", MetricsQueryView.as_view(), name="metrics-query"),
]
