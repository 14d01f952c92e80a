"""The rollout page (split, step and timer, overlaid per-revision charts, analysis results) and its buttons:
promote and abort ask for confirmation first (a GET shows what will happen, the POST does it); pause and resume act
at once. The same services as the API's."""
from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse

from controlplane.errors import ControlPlaneError
from controlplane.rollouts.report import rollout_report
from controlplane.rollouts.selectors import rollout_get
from controlplane.rollouts.services import rollout_abort, rollout_pause, rollout_promote, rollout_resume
from dashboards.access import operator_required, viewer_required
from dashboards.views.common import page, posted_key
from dashboards.views.pages import get_deployment_or_404

VERBS = {"promote": rollout_promote, "abort": rollout_abort, "pause": rollout_pause, "resume": rollout_resume}
CONFIRMED = ("promote", "abort")
CHART_METRICS = (("e2e_p99_seconds", "P99 end-to-end (s)"), ("ttft_p99_seconds", "P99 time to first token (s)"),
                 ("itl_p99_seconds", "P99 inter-token latency (s)"), ("error_ratio", "error ratio"))


def _rollout_or_404(deployment, rollout_id: int):
    try:
        return rollout_get(deployment, rollout_id)
    except ControlPlaneError as error:
        raise Http404(error.message) from None


def rollout_figures(rollout) -> list[dict]:
    """One Plotly figure per metric: stable's line solid, the tried revision's dashed, over every analysis run."""
    stable_name, tried_name = rollout.variants
    points = [point for run in rollout.analysis_runs.all() for point in run.points]
    figures = []
    for metric, title in CHART_METRICS:
        data = []
        for name, dash in ((stable_name, "solid"), (tried_name, "dash")):
            key = f"{name}.{metric}"
            revision = rollout.stable_revision.number if name == stable_name else rollout.revision.number
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"{name} (#{revision})",
                         "x": [datetime.fromtimestamp(p["t"], tz=dt_timezone.utc).isoformat()
                               for p in points if p.get(key) is not None],
                         "y": [p[key] for p in points if p.get(key) is not None],
                         "line": {"dash": dash}})
        figures.append({"key": metric, "data": data, "layout": {
            "title": {"text": title}, "height": 260, "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
            "legend": {"orientation": "h"}}})
    return figures


@viewer_required
def rollout_page(request, name: str, rollout_id: int):
    deployment = get_deployment_or_404(name)
    rollout = _rollout_or_404(deployment, rollout_id)
    step = rollout.current_step
    remaining = max(0.0, step["duration_s"] - rollout.step_elapsed()) if step and rollout.is_active else None
    stable_name, tried_name = rollout.variants
    return page(request, "dashboards/rollout.html", {
        "deployment": deployment, "rollout": rollout, "step": step, "step_number": rollout.step_index + 1,
        "remaining_s": remaining, "timer_started": rollout.step_started_at is not None,
        "stable_name": stable_name, "tried_name": tried_name, "stable_weight": 100 - rollout.weight,
        "report": rollout_report(rollout), "figures": rollout_figures(rollout),
    })


@operator_required
def rollout_verb_view(request, name: str, rollout_id: int, verb: str):
    """POST: the verb (promote and abort only from their confirmation page); GET of promote/abort: that page."""
    if verb not in VERBS:
        raise Http404(f"no such rollout action {verb!r}")
    deployment = get_deployment_or_404(name)
    rollout = _rollout_or_404(deployment, rollout_id)
    here = reverse("dashboards:rollout", args=[name, rollout.pk])
    if request.method != "POST":
        if verb not in CONFIRMED:
            return redirect(here)
        return page(request, "dashboards/rollout_confirm.html", {"deployment": deployment, "rollout": rollout,
                                                                 "verb": verb})
    reason = (request.POST.get("reason") or "").strip()[:2000]
    try:
        action = VERBS[verb](rollout=rollout, actor=request.user, reason=f"dashboard: {reason or verb}",
                             idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return redirect(here)
    messages.success(request, f"Rollout {rollout.pk}: {verb} recorded as action #{action.pk}.")
    return redirect(here)
