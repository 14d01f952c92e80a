"""Read-only pages: the fleet overview and a deployment (with its live fragment and chart data)."""
from __future__ import annotations

import time
from datetime import timedelta
from urllib.parse import urlencode

from django.http import Http404, HttpResponse
from django.utils import timezone

from controlplane.autoscaling.advice import open_advice
from controlplane.autoscaling.selectors import autoscaling_settings
from controlplane.capacity.selectors import schedule_rows
from controlplane.errors import ControlPlaneError
from controlplane.models.deployments import engine_settings_parts
from controlplane.models.workers import LIVE_STATUSES, WorkerStatus
from controlplane.revision_diff import PART_ORDER
from controlplane.rollouts.models import Strategy
from controlplane.rollouts.selectors import rollout_active
from controlplane.selectors import deployment_get, deployment_rollout_in_progress, health_hold_get
from controlplane.tenants.usage import usage_by_tenant
from controlplane.tenant_provider import admission as admission_settings
from dashboards.access import viewer_required
from dashboards.chaos import chaos_section
from dashboards.chart_cache import cached_json, max_ages
from dashboards.fleet import fleet_rows, node_rows, shared_gateway_rows
from dashboards.panels import RANGES, chart_figures, deployment_has_gpu, parse_range
from dashboards.selectors import active_alerts, deployment_workers, pool_policies, recent_actions
from dashboards.stages import objectives_of, stage_charts, stage_values
from dashboards.views.common import page
from inference.sampling_params import SAMPLING_DEFAULT_FIELDS

# Stopped workers stay in the table this long, so that what just happened (a drain, a replaced worker) is visible.
RECENTLY_STOPPED = timedelta(minutes=15)
NUM_RECENT_ACTIONS = 8


def get_deployment_or_404(name: str):
    try:
        return deployment_get(name)
    except ControlPlaneError as error:
        raise Http404(error.message) from None


@viewer_required
def overview(request):
    return page(request, "dashboards/overview.html", {"rows": fleet_rows(), "nodes": node_rows(),
                                                      "shared_gateways": shared_gateway_rows(),
                                                      "health_hold": health_hold_get()})


def revision_pill(worker, deployment, rollout) -> tuple[str, str] | None:
    """The pill beside a worker's revision: during a rollout the tried revision's workers are "canary" (or "B"
    of an A/B test) and, in an A/B test, stable's are "A"; a revision that is neither current nor part of the
    rollout is "old" (its workers are being replaced)."""
    if worker.revision_id is None:
        return None
    if rollout is not None:
        if worker.revision_id == rollout.revision_id:
            return ("B", "busy") if rollout.strategy == Strategy.AB else ("canary", "busy")
        if worker.revision_id == rollout.stable_revision_id and rollout.strategy == Strategy.AB:
            return ("A", "muted")
    if worker.revision_id != deployment.current_revision_id:
        return ("old", "warn")
    return None


def live_context(request, deployment) -> dict:
    """What the live part of the deployment page shows (refreshed every 5 s as an HTML fragment)."""
    pools = list(deployment.pools.all())
    policies, advice = pool_policies(deployment), open_advice([pool.pk for pool in pools])
    for pool in pools:
        pool.policy, pool.advice = policies.get(pool.pk), advice.get(pool.pk)
    now = timezone.now()
    workers = deployment_workers(deployment, stopped_since=now - RECENTLY_STOPPED)
    # Stopped workers (replaced, drained, scaled away) are hidden unless asked for: after a few restarts of the
    # stack or a rollout they would outnumber the live ones.
    show_stopped = request.GET.get("stopped") == "1"
    num_stopped = sum(1 for worker in workers if worker.status == WorkerStatus.STOPPED)
    if not show_stopped:
        workers = [worker for worker in workers if worker.status != WorkerStatus.STOPPED]
    for worker in workers:
        since = worker.ready_at or worker.started_at
        worker.uptime = (now - since) if since and worker.status in LIVE_STATUSES else None
        gpus = worker.node.gpus if worker.node else []
        gpu = next((g for g in gpus if g.get("index") == worker.gpu_index), None) if worker.gpu_index is not None \
            else None
        worker.gpu_label = (f"GPU {worker.gpu_index} · {gpu.get('name', '')}" if gpu
                            else f"GPU {worker.gpu_index}" if worker.gpu_index is not None else "CPU")
        # What the endpoints answer gives the gateway for it (gateways have no pool and no weight).
        worker.weight = worker.pool.routing_weight(worker.node) if worker.pool else None
        worker.can_restart = worker.status not in (WorkerStatus.STOPPED, WorkerStatus.DRAINING)
        worker.can_drain = worker.role != "gateway" and worker.status in (
            WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY)
    canary = rollout_active(deployment)
    for worker in workers:
        worker.revision_pill = revision_pill(worker, deployment, canary)
    highlight = request.GET.get("action")
    highlight = int(highlight) if highlight and highlight.isdigit() and len(highlight) < 10 else None
    actions = recent_actions(deployment, limit=NUM_RECENT_ACTIONS)
    alerts = active_alerts(deployment)
    # The query the page's 5-second refresh of this fragment repeats, so that it shows what the page shows.
    live_query = urlencode({key: value for key, value in (("action", highlight), ("stopped", show_stopped and 1))
                            if value})
    return {"deployment": deployment, "pools": pools, "workers": workers, "actions": actions,
            "highlight_action": highlight, "show_stopped": show_stopped, "num_stopped": num_stopped,
            "recently_stopped_minutes": int(RECENTLY_STOPPED.total_seconds() // 60), "live_query": live_query,
            "alerts": alerts, "rollout": deployment_rollout_in_progress(deployment),
            "canary": canary, "autoscaling": autoscaling_settings(deployment)}


@viewer_required
def deployment_detail(request, name: str):
    deployment = get_deployment_or_404(name)
    context = live_context(request, deployment)
    revision = deployment.current_revision
    parts = engine_settings_parts(revision.engine_settings if revision else {})
    context.update(schedules=schedule_rows(deployment.pools.order_by("role")), chaos=chaos_section(deployment))
    # In the gateway's field order: a JSON column's key order is the database's (PostgreSQL's jsonb sorts them).
    defaults = deployment.sampling_defaults or {}
    context.update(sampling_defaults=[(key, defaults[key]) for key in SAMPLING_DEFAULT_FIELDS if key in defaults])
    admission = admission_settings(deployment)
    rows = [("max_queued", admission["max_queued"])] if "max_queued" in admission else []
    rows += [(f"queue_deadlines.{c}", f"{s:g} s") for c, s in (admission.get("queue_deadlines") or {}).items()]
    context.update(admission=rows, tenant_usage=usage_by_tenant(deployment))
    has_gpu = deployment_has_gpu(deployment)
    context.update(range_key=parse_range(request.GET.get("range")), ranges=list(RANGES), has_gpu=has_gpu,
                   chart_max_ages=[(key, age) for key, age in max_ages().items() if age],
                   engine_parts=[(part, sorted(parts[part].items())) for part in PART_ORDER if parts.get(part)],
                   stage_columns=stage_values(deployment, has_gpu=has_gpu), objectives=objectives_of(deployment))
    return page(request, "dashboards/deployment.html", context)


@viewer_required
def deployment_live(request, name: str):
    """The pools, workers, alerts and recent actions as an HTML fragment for the page's 5-second refresh."""
    deployment = get_deployment_or_404(name)
    return page(request, "dashboards/_deployment_live.html", live_context(request, deployment))


def _json(body: bytes) -> HttpResponse:
    response = HttpResponse(body, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


@viewer_required
def deployment_charts(request, name: str):
    """The chart figures as JSON for `Plotly.react`: {"figures": {key: {"data", "layout"}}, "order": [...]}; long
    ranges are reused for a few seconds (dashboards.chart_cache)."""
    deployment = get_deployment_or_404(name)
    range_key, now = parse_range(request.GET.get("range")), time.time()
    return _json(cached_json("charts", deployment, range_key, now=now,
                             build=lambda: chart_figures(deployment, range_key=range_key, now=now)))


@viewer_required
def deployment_stages(request, name: str):
    """The stage columns' figures and current values as JSON ({"columns", "figures", "health_order", "has_gpu"}):
    a request of its own, fetched beside charts.json, so that neither waits for the other's series reads. Long
    ranges are reused for a few seconds (dashboards.chart_cache)."""
    deployment = get_deployment_or_404(name)
    range_key, now = parse_range(request.GET.get("range")), time.time()
    return _json(cached_json("stages", deployment, range_key, now=now,
                             build=lambda: stage_charts(deployment, range_key=range_key, now=now)))
