from django.urls import path

from controlplane.api.urls import verb
from controlplane.tenants import api, usage_api

urlpatterns = [
    path("tenants/", api.TenantListView.as_view(), name="tenant-list"),
    path("tenants/<str:name>/", api.TenantDetailView.as_view(), name="tenant-detail"),
    path("tenants/<str:name>/usage", usage_api.TenantUsageView.as_view(), name="tenant-usage"),
    path("tenants/<str:name>/usage.csv", usage_api.TenantUsageCsvView.as_view(), name="tenant-usage-csv"),
    path("tenants/<str:name>/keys/", api.KeyListView.as_view(), name="tenant-key-list"),
    path("tenants/<str:name>/keys/<int:key_id>/", api.KeyDetailView.as_view(), name="tenant-key-detail"),
    *verb("deployments/<str:name>/access", api.AccessView, "deployment-access"),
]
