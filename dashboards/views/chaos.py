"""The Abort button of the deployment page's chaos card (dashboards.chaos): the API's service, run_abort."""
from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect
from django.urls import reverse

from controlplane.chaos.selectors import run_get
from controlplane.chaos.services import run_abort
from controlplane.errors import ControlPlaneError
from dashboards.access import operator_required
from dashboards.views.pages import get_deployment_or_404


@operator_required
def chaos_abort_view(request, name: str, run_id: int):
    """POST: abort the run now (every fault reverted), as POST .../chaos/runs/{id}/abort does."""
    deployment = get_deployment_or_404(name)
    here = reverse("dashboards:deployment", args=[name]) + "#chaos"
    if request.method != "POST":
        return redirect(here)
    reason = (request.POST.get("reason") or "").strip()[:2000]
    try:
        run = run_abort(run=run_get(deployment, run_id), actor=request.user,
                        reason=f"dashboard: {reason or 'aborted from the deployment page'}")
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return redirect(here)
    messages.success(request, f"Chaos run {run.pk} aborted: every fault is being reverted.")
    return redirect(here)
