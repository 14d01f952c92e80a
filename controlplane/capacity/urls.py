"""Included at the project root by controlplane/urls.py: `path("", include("controlplane.capacity.urls"))`."""
from django.urls import path

from controlplane.capacity import api


def _both(route: str, view, name: str) -> list:
    return [path(route, view.as_view(), name=name), path(route + "/", view.as_view(schema=None))]


urlpatterns = [
    *_both("api/v1/deployments/<str:name>/profiles", api.ProfilesView, "deployment-profiles"),
    *_both("api/v1/profile-jobs/<int:job_id>", api.ProfileJobView, "profile-job"),
    *_both("api/v1/capacity/plan", api.PlanView, "capacity-plan"),
    *_both("api/v1/capacity/plan/apply", api.PlanApplyView, "capacity-plan-apply"),
    *_both("api/v1/deployments/<str:name>/schedules", api.SchedulesView, "deployment-schedules"),
    *_both("api/v1/deployments/<str:name>/schedules/<int:schedule_id>", api.ScheduleDetailView,
           "deployment-schedule"),
    *_both("api/v1/deployments/<str:name>/predictive", api.PredictiveView, "deployment-predictive"),
]
