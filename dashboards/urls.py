from django.urls import path

from dashboards.views import alerts, assets, capacity, chaos, controls, history, pages, rollouts, tenants, what_if

app_name = "dashboards"

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("deployments/<slug:name>/", pages.deployment_detail, name="deployment"),
    path("deployments/<slug:name>/live", pages.deployment_live, name="deployment-live"),
    path("deployments/<slug:name>/charts.json", pages.deployment_charts, name="deployment-charts"),
    path("deployments/<slug:name>/stages.json", pages.deployment_stages, name="deployment-stages"),
    path("deployments/<slug:name>/revisions/", history.revisions_page, name="revisions"),
    path("deployments/<slug:name>/capacity/", capacity.capacity_page, name="capacity"),
    path("deployments/<slug:name>/capacity/profiles", capacity.capacity_profiles, name="capacity-profiles"),
    path("deployments/<slug:name>/what-if", what_if.what_if_page, name="what-if"),
    path("deployments/<slug:name>/pools/<slug:role>/scale", controls.pool_scale_view, name="pool-scale"),
    path("deployments/<slug:name>/rollback/<int:number>/", controls.rollback_view, name="rollback"),
    path("deployments/<slug:name>/autoscaling", controls.autoscaling_view, name="autoscaling"),
    path("deployments/<slug:name>/autoscaling/advice/<int:advice_id>/apply", controls.advice_apply_view,
         name="autoscaling-advice-apply"),
    path("deployments/<slug:name>/objectives", controls.objectives_view, name="objectives"),
    path("deployments/<slug:name>/rollouts/<int:rollout_id>/", rollouts.rollout_page, name="rollout"),
    path("deployments/<slug:name>/rollouts/<int:rollout_id>/<slug:verb>", rollouts.rollout_verb_view,
         name="rollout-verb"),
    path("deployments/<slug:name>/chaos/runs/<int:run_id>", chaos.chaos_run_page, name="chaos-run"),
    path("deployments/<slug:name>/chaos/runs/<int:run_id>/abort", chaos.chaos_abort_view, name="chaos-abort"),
    path("deployments/<slug:name>/chaos/run", chaos.chaos_run_start_view, name="chaos-run-start"),
    path("deployments/<slug:name>/chaos/opt-in", chaos.chaos_opt_in_view, name="chaos-opt-in"),
    path("deployments/<slug:name>/chaos/experiments", chaos.chaos_experiment_create_view,
         name="chaos-experiment-create"),
    path("workers/<int:worker_id>/restart", controls.worker_restart_view, name="worker-restart"),
    path("workers/<int:worker_id>/drain", controls.worker_drain_view, name="worker-drain"),
    path("tenants/", tenants.tenants_page, name="tenants"),
    path("tenants/<slug:name>/", tenants.tenant_page, name="tenant"),
    path("tenants/<slug:name>/charts.json", tenants.tenant_charts, name="tenant-charts"),
    path("actions/", history.actions_page, name="actions"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/<int:alert_id>/silence", alerts.silence_create_view, name="alert-silence"),
    path("silences/<int:silence_id>/expire", alerts.silence_expire_view, name="silence-expire"),
    path("alerts/rules/new", alerts.rule_edit_view, name="rule-create"),
    path("alerts/rules/<int:rule_id>/", alerts.rule_edit_view, name="rule-edit"),
    path("assets/plotly-<str:version>.min.js", assets.plotly_js, name="plotly-js"),
]
