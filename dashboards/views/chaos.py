"""The chaos pages: a run's report page, and the chaos card's forms (dashboards.chaos): admins opt the deployment
in or out and create an experiment from a built-in template, operators run an experiment and abort a run. Each
form calls the API's own service, so a refusal (a 400 naming the field, 403 not opted in, 409 not steady or a run
already active) is the API's message on the page, never a 500."""
from __future__ import annotations

import time

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from controlplane.chaos.report import run_report
from controlplane.chaos.selectors import experiment_get, run_get
from controlplane.chaos.services import chaos_enable, experiment_from_template, run_abort, run_start
from controlplane.errors import ControlPlaneError
from dashboards.access import admin_for_writes, operator_required, viewer_required
from dashboards.chaos_run import MARGIN_S, check_rows, run_figures
from dashboards.views.common import page, posted_key
from dashboards.views.pages import get_deployment_or_404

MAX_REASON = 2000


def _card(name: str):
    return redirect(reverse("dashboards:deployment", args=[name]) + "#chaos")


def _run_page(name: str, run_id: int):
    return redirect(reverse("dashboards:chaos-run", args=[name, run_id]))


@viewer_required
def chaos_run_page(request, name: str, run_id: int):
    """A run's report as a page: verdict, the hypothesis before / during / after with a chart per check, recovery,
    requests, faults and the actions written meanwhile. Built live (and reloaded every 5 s) while the run is
    active; the stored report once it finished."""
    deployment = get_deployment_or_404(name)
    try:
        run = run_get(deployment, run_id)
    except ControlPlaneError as error:
        raise Http404(error.message) from None
    report = run.report if run.finished_at else run_report(run)
    rows = check_rows(run)
    figures = run_figures(run, rows, now=time.time())
    return page(request, "dashboards/chaos_run.html", {
        "deployment": deployment, "run": run, "report": report, "checks": rows, "figures": figures,
        "margin_s": MARGIN_S})


@require_POST
@operator_required
def chaos_abort_view(request, name: str, run_id: int):
    """Abort the run now (every fault reverted), as POST .../chaos/runs/{id}/abort does."""
    deployment = get_deployment_or_404(name)
    reason = (request.POST.get("reason") or "").strip()[:MAX_REASON]
    try:
        run = run_abort(run=run_get(deployment, run_id), actor=request.user,
                        reason=f"dashboard: {reason or 'aborted from the deployment page'}")
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _card(name)
    messages.success(request, f"Chaos run {run.pk} aborted: every fault is being reverted.")
    return _card(name)


@require_POST
@operator_required
def chaos_run_start_view(request, name: str):
    """Run an existing experiment (operator), as POST .../chaos/experiments/{experiment}/run does; on success, to
    the run's live report."""
    deployment = get_deployment_or_404(name)
    reason = (request.POST.get("reason") or "").strip()[:MAX_REASON]
    try:
        experiment = experiment_get(deployment, (request.POST.get("experiment") or "")[:63])
        run = run_start(experiment=experiment, actor=request.user, idempotency_key=posted_key(request),
                        reason=f"dashboard: {reason or 'run from the deployment page'}")
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _card(name)
    messages.success(request, f"Chaos run {run.pk} of {experiment.name} started.")
    return _run_page(name, run.pk)


@require_POST
@admin_for_writes
def chaos_opt_in_view(request, name: str):
    """Opt the deployment in or out (admin), as PUT .../chaos does."""
    deployment = get_deployment_or_404(name)
    enabled = request.POST.get("enabled")
    if enabled not in ("on", "off"):
        messages.error(request, "enabled must be on or off")
        return _card(name)
    try:
        chaos_enable(deployment=deployment, enabled=enabled == "on", actor=request.user,
                     reason="dashboard: chaos opt-in", idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _card(name)
    messages.success(request, f"Chaos experiments on {name}: {'opted in' if enabled == 'on' else 'opted out'}.")
    return _card(name)


def _number(raw: str):
    """A form field as the JSON number the API would get; anything else as given, for the service to name."""
    raw = raw.strip()
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw[:40]


@require_POST
@admin_for_writes
def chaos_experiment_create_view(request, name: str):
    """Create an experiment from a built-in template (admin): the template's faults, hypothesis and abort
    conditions with the target role, count, node and duration of the form."""
    deployment = get_deployment_or_404(name)
    post = request.POST
    try:
        experiment = experiment_from_template(
            deployment=deployment, actor=request.user, template=post.get("template"),
            name=(post.get("name") or "").strip() or None, role=post.get("role") or None,
            count=_number(post.get("count") or "1"), node=(post.get("node") or "").strip() or None,
            duration_s=_number(post["duration_s"]) if (post.get("duration_s") or "").strip() else None)
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _card(name)
    messages.success(request, f"Experiment {experiment.name} created: {len(experiment.faults)} fault(s) on "
                              f"{experiment.target['role']}"
                              + (f" on node {experiment.target['node']}" if "node" in experiment.target else "")
                              + f" for {experiment.duration_s:g} s.")
    return _card(name)

