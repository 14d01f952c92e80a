"""Included under /api/v1/ by controlplane/urls.py."""
from django.urls import path

from controlplane.api.urls import verb
from controlplane.replay import api

urlpatterns = [
    path("deployments/<str:name>/traces/", api.TraceListView.as_view(), name="trace-list"),
    *verb("deployments/<str:name>/traces/import", api.TraceImportView, "trace-import"),
    path("deployments/<str:name>/traces/<str:trace>/", api.TraceDetailView.as_view(), name="trace-detail"),
    path("deployments/<str:name>/traces/<str:trace>/requests.jsonl", api.TraceRequestsView.as_view(),
         name="trace-requests"),
    *verb("deployments/<str:name>/what-if", api.WhatIfView, "deployment-what-if"),
    *verb("deployments/<str:name>/change-gate", api.ChangeGateView, "deployment-change-gate"),
]
