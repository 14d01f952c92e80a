"""The rollout page (split, step and timer, overlaid per-revision charts, analysis results) and its buttons:
promote and abort ask for confirmation first (a GET shows what will happen, the POST does it); pause and resume act
at once. The same services as the API's."""
from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse

from controlplane.errors import ControlPlaneError
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import auto_step
from controlplane.rollouts.report import rollout_report
from controlplane.rollouts.selectors import rollout_get
from controlplane.rollouts.services import rollout_abort, rollout_pause, rollout_promote, rollout_resume
from dashboards.access import operator_required, viewer_required
from dashboards.buckets import histogram_top
from dashboards.charts import Axis, Series, error_figure, line_figure
from dashboards.views.common import page, posted_key
from dashboards.views.pages import get_deployment_or_404

VERBS = {"promote": rollout_promote, "abort": rollout_abort, "pause": rollout_pause, "resume": rollout_resume}
CONFIRMED = ("promote", "abort")
# The gateway's per-revision series, drawn with the deployment page's chart style (dashboards.charts).
CHART_METRICS = (("e2e_p99_seconds", "P99 end-to-end latency", "seconds"),
                 ("ttft_p99_seconds", "P99 time to first token", "seconds"),
                 ("itl_p99_seconds", "P99 inter-token latency", "seconds"), ("error_ratio", "Error ratio", "ratio"),
                 ("qps", "Requests per second", "requests_per_second"))
MAX_POINTS = 2000  # per series (a longer one is downsampled); auto_step gives about 300


def _rollout_or_404(deployment, rollout_id: int):
    try:
        return rollout_get(deployment, rollout_id)
    except ControlPlaneError as error:
        raise Http404(error.message) from None


def rollout_figures(rollout, *, now: datetime | None = None) -> list[dict]:
    """One figure per metric over the rollout's life, in the deployment page's style: the gateway's series per
    revision, read through the metrics backend (embedded: observability.RevisionSample; prometheus: the
    tandem_revision: recording rules) as the mean of each step, stable's line solid, the tried revision's dashed.
    A backend that does not answer draws every chart as its error. Each is {"key": metric, "data", "layout"}."""
    start = rollout.created_at.timestamp() - 60
    end = (rollout.finished_at or now or datetime.now(tz=dt_timezone.utc)).timestamp() + 60
    revisions = {rollout.stable_revision.number: (rollout.variants[0], "solid"),
                 rollout.revision.number: (rollout.variants[1], "dash")}
    error = None
    try:
        series = reader().revision_range(deployment_id=rollout.deployment_id, revisions=list(revisions),
                                         metrics=[metric for metric, _, _ in CHART_METRICS], start=start, end=end,
                                         step=auto_step(start, end))
    except MetricsUnavailable as exc:
        series, error = {}, str(exc)
    figures = []
    for metric, title, unit in CHART_METRICS:
        if error:
            figures.append({"key": metric, **error_figure(title, error, x_range=(start, end))})
            continue
        lines = [Series(f"{name} (#{revision})", series.get((revision, metric), []), dash,
                        group=name, top=histogram_top(metric))
                 for revision, (name, dash) in revisions.items()]
        figure = line_figure(title, lines, Axis(unit), x_range=(start, end), max_points=MAX_POINTS,
                             empty_reason="no samples of this revision's series yet")
        figures.append({"key": metric, **figure})
    return figures


@viewer_required
def rollout_page(request, name: str, rollout_id: int):
    deployment = get_deployment_or_404(name)
    rollout = _rollout_or_404(deployment, rollout_id)
    step = rollout.current_step
    remaining = max(0.0, step["duration_s"] - rollout.step_elapsed()) if step and rollout.is_active else None
    stable_name, tried_name = rollout.variants
    figures = rollout_figures(rollout)
    return page(request, "dashboards/rollout.html", {
        "deployment": deployment, "rollout": rollout, "step": step, "step_number": rollout.step_index + 1,
        "remaining_s": remaining, "timer_started": rollout.step_started_at is not None,
        "stable_name": stable_name, "tried_name": tried_name, "stable_weight": 100 - rollout.weight,
        "report": rollout_report(rollout), "figures": figures,
        "has_points": any(trace["x"] for figure in figures for trace in figure["data"]),
        "scrape_interval_s": settings.TANDEM_SCRAPE_INTERVAL_S,
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
