from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny

from controlplane.observability.healthz import healthz

def favicon(request):
    """No icon, and no 404 for the browsers that ask for one anyway (the pages point theirs at nothing)."""
    return HttpResponse(status=204, headers={"Cache-Control": "max-age=86400"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon),
    path("", include("controlplane.observability.urls")),  # /metrics, /api/v1/metrics/query
    path("", include("controlplane.autoscaling.urls")),  # /api/v1/deployments/{name}/autoscaling
    path("", include("controlplane.capacity.urls")),  # profiles, the capacity planner, schedules, predictive
    path("api/v1/", include("controlplane.alerting.api.urls")),  # alert rules, alerts, silences, channels, webhooks
    path("api/v1/", include("controlplane.api.urls")),
    path("api/v1/", include("controlplane.rollouts.urls")),  # canary and A/B rollouts
    path("api/v1/", include("controlplane.chaos.urls")),  # chaos experiments and their runs
    path("api/v1/", include("controlplane.replay.urls")),  # request traces, replays before a change
    path("api/v1/", include("controlplane.tenants.urls")),  # tenants, their keys, deployments' key requirement
    # The schema describes the API, not the fleet: readable without a token, like the docs page that loads it.
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="schema"),
    # The split view serves its start-up script from a URL: the Content-Security-Policy allows no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema", permission_classes=[AllowAny]),
         name="swagger-ui"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("dashboards.urls")),
]
