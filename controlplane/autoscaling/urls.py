"""Included at the project root by controlplane/urls.py: `path("", include("controlplane.autoscaling.urls"))`."""
from django.urls import path

from controlplane.autoscaling.api import AdviceApplyView, AdviceListView, AutoscalingView

urlpatterns = [
    path("api/v1/deployments/<str:name>/autoscaling", AutoscalingView.as_view(), name="deployment-autoscaling"),
    path("api/v1/deployments/<str:name>/autoscaling/", AutoscalingView.as_view(schema=None)),
    path("api/v1/deployments/<str:name>/autoscaling/advice", AdviceListView.as_view(), name="autoscaling-advice"),
    path("api/v1/deployments/<str:name>/autoscaling/advice/<int:advice_id>/apply", AdviceApplyView.as_view(),
         name="autoscaling-advice-apply"),
]
