from django.urls import path

from controlplane.api.urls import verb
from controlplane.rollouts import api

urlpatterns = [
    *verb("deployments/<str:name>/rollouts", api.RolloutListView, "rollout-list"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>", api.RolloutDetailView, "rollout-detail"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>/promote", api.RolloutPromoteView, "rollout-promote"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>/abort", api.RolloutAbortView, "rollout-abort"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>/pause", api.RolloutPauseView, "rollout-pause"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>/resume", api.RolloutResumeView, "rollout-resume"),
    *verb("deployments/<str:name>/rollouts/<int:rollout_id>/report", api.RolloutReportView, "rollout-report"),
    path("deployments/<str:name>/rollouts/<int:rollout_id>/report.csv", api.RolloutReportCsvView.as_view(),
         name="rollout-report-csv"),
]
