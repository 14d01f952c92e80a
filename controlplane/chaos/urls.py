from controlplane.api.urls import verb
from controlplane.chaos import api, runs_api, schedules_api

urlpatterns = [
    *verb("deployments/<str:name>/chaos", api.ChaosSettingsView, "chaos-settings"),
    *verb("deployments/<str:name>/chaos/experiments", api.ExperimentListView, "chaos-experiment-list"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>", api.ExperimentDetailView,
          "chaos-experiment-detail"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>/run", runs_api.ExperimentRunView,
          "chaos-experiment-run"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>/steady-state", api.ExperimentSteadyStateView,
          "chaos-experiment-steady-state"),
    *verb("deployments/<str:name>/chaos/experiments/<str:experiment>/chaostoolkit.json",
          api.ExperimentChaosToolkitView, "chaos-experiment-chaostoolkit"),
    *verb("deployments/<str:name>/chaos/import", api.ExperimentImportView, "chaos-experiment-import"),
    *verb("deployments/<str:name>/chaos/templates", api.TemplateListView, "chaos-template-list"),
    *verb("deployments/<str:name>/chaos/templates/<str:key>", api.TemplateCreateView, "chaos-template-create"),
    *verb("deployments/<str:name>/chaos/runs", runs_api.RunListView, "chaos-run-list"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>", runs_api.RunDetailView, "chaos-run-detail"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>/abort", runs_api.RunAbortView, "chaos-run-abort"),
    *verb("deployments/<str:name>/chaos/runs/<int:run_id>/report", runs_api.RunReportView, "chaos-run-report"),
    *verb("deployments/<str:name>/chaos/schedules", schedules_api.ScheduleListView, "chaos-schedule-list"),
    *verb("deployments/<str:name>/chaos/schedules/<int:schedule_id>", schedules_api.ScheduleDetailView,
          "chaos-schedule-detail"),
]
