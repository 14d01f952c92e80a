from controlplane.api.urls import verb
from controlplane.chaos import api

urlpatterns = [
    *verb("deployments/<str:name>/chaos", api.ChaosSettingsView, "chaos-settings"),
    *verb("deployments/<str:name>/chaos/experiments", api.ExperimentListView, "chaos-experiment-list"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>", api.ExperimentDetailView,
          "chaos-experiment-detail"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>/run", api.ExperimentRunView,
          "chaos-experiment-run"),
    *verb("deployments/<str:name>/chaos/runs", api.RunListView, "chaos-run-list"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>", api.RunDetailView, "chaos-run-detail"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>/abort", api.RunAbortView, "chaos-run-abort"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>/report", api.RunReportView, "chaos-run-report"),
]
