"""The buttons: each POST calls the same service as the REST API (so it is an Action row with the user as actor),
then returns to the page, which shows the action's progress. A ControlPlaneError (replicas outside min..max, a
rollout already running, ...) becomes a message on the page, never a 500."""
from __future__ import annotations

import re
from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane import change_gate
from controlplane.autoscaling.advice import advice_apply
from controlplane.autoscaling.services import autoscaling_update, gated_change
from controlplane.change_gate import GATE_REFUSED
from controlplane.errors import ControlPlaneError
from controlplane.models import Worker
from controlplane.models.workers import LIVE_STATUSES
from controlplane.revision_diff import revision_diff
from controlplane.selectors import MAX_ID, revision_get, revision_list, worker_get
from controlplane.models.deployments import DEFAULT_OBJECTIVES
from controlplane.services import (deployment_objectives_set, deployment_rollback, pool_scale, pool_scale_by,
                                   worker_drain, worker_restart)
from dashboards.access import operator_required
from dashboards.panels import RANGES
from dashboards.views.common import page, posted_key
from dashboards.views.pages import get_deployment_or_404

MAX_REASON = 2000


def _reason(request, default: str) -> str:
    reason = (request.POST.get("reason") or "").strip()[:MAX_REASON]
    return f"dashboard: {reason}" if reason else f"dashboard: {default}"


def _back(request, deployment_name: str, action=None):
    """To the deployment page, keeping its time range (the page's script posts it) and naming the new action."""
    query = {}
    if request.POST.get("range") in RANGES:
        query["range"] = request.POST["range"]
    if action is not None:
        query["action"] = action.pk
    url = reverse("dashboards:deployment", args=[deployment_name])
    return redirect(f"{url}?{urlencode(query)}" if query else url)


def _gated(request, deployment, change: dict):
    """None where the deployment's change gate lets `change` through (controlplane/change_gate.py), or where the
    operator confirmed it on the page this returns otherwise: the gate's prediction, and a button that posts the
    same form again, acknowledged."""
    if not change or request.POST.get("acknowledge_prediction") == "1":
        return None
    try:
        change_gate.check(deployment, change)
    except ControlPlaneError as error:
        if error.code != GATE_REFUSED:
            raise
        fields = [(name, value) for name, value in request.POST.items()
                  if name not in ("csrfmiddlewaretoken", "acknowledge_prediction")]
        return page(request, "dashboards/gate_confirm.html", {
            "deployment": deployment, "prediction": error.extra.get("prediction") or {}, "fields": fields,
            "objectives": deployment.objectives or {}})
    return None


def _done(request, action, what: str) -> None:
    messages.success(request, f"{what}: action #{action.pk} is {action.status}. Its progress shows below.")


@require_POST
@operator_required
def pool_scale_view(request, name: str, role: str):
    deployment = get_deployment_or_404(name)
    pool = next((p for p in deployment.pools.all() if p.role == role), None)
    if pool is None:
        messages.error(request, f"deployment {name!r} has no {role!r} pool")
        return _back(request, name)
    op = request.POST.get("op")
    key = posted_key(request)
    try:
        raw = (request.POST.get("replicas") or "").strip()
        whole = re.fullmatch(r"-?[0-9]{1,6}", raw) is not None
        target = pool.desired_replicas + (1 if op == "up" else -1) if op in ("up", "down") else \
            int(raw) if op == "set" and whole else None
        if target is not None:
            confirm = _gated(request, deployment, {"pools": {role: {"replicas": target}}})
            if confirm is not None:
                return confirm
        if op in ("up", "down"):
            step = 1 if op == "up" else -1
            action = pool_scale_by(deployment=deployment, role=role, step=step, actor=request.user,
                                   reason=_reason(request, f"scale {role} {op} by 1"), idempotency_key=key)
        elif op == "set":
            if not whole:
                messages.error(request, f"replicas must be a whole number, not {raw!r}")
                return _back(request, name)
            replicas = int(raw)
            action = pool_scale(deployment=deployment, role=role, replicas=replicas, actor=request.user,
                                reason=_reason(request, f"scale {role} {pool.desired_replicas} → {replicas}"),
                                idempotency_key=key)
        else:
            messages.error(request, "choose +1, −1 or set a number of replicas")
            return _back(request, name)
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, name)
    _done(request, action, f"Scaling {role} from {action.params['from']} to {action.params['to']}")
    return _back(request, name, action)


def _worker_or_404(worker_id: int) -> Worker:
    try:
        return worker_get(worker_id)
    except ControlPlaneError as error:
        raise Http404(error.message) from None


@require_POST
@operator_required
def worker_restart_view(request, worker_id: int):
    worker = _worker_or_404(worker_id)
    try:
        action = worker_restart(worker=worker, actor=request.user, reason=_reason(request, "restart"),
                                idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, worker.deployment.name)
    _done(request, action, f"Restarting {worker.role} worker #{worker.pk}")
    return _back(request, worker.deployment.name, action)


@require_POST
@operator_required
def worker_drain_view(request, worker_id: int):
    worker = _worker_or_404(worker_id)
    try:
        action = worker_drain(worker=worker, actor=request.user, reason=_reason(request, "drain"),
                              idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, worker.deployment.name)
    _done(request, action, f"Draining {worker.role} worker #{worker.pk}")
    return _back(request, worker.deployment.name, action)


def rollback_plan(deployment, target) -> dict:
    """What a rollback to `target` starts (every pool's desired workers of `target`, all at once: see
    supervision/reconcile.py) and replaces (the live workers of each pool that run another revision)."""
    replaced: dict[str, list[Worker]] = {}
    workers = (Worker.objects.filter(deployment=deployment, status__in=LIVE_STATUSES, revision__isnull=False)
               .exclude(revision=target).select_related("revision", "node").order_by("role", "id"))
    for worker in workers:
        replaced.setdefault(worker.role, []).append(worker)
    pools = [{"role": pool.role, "desired": pool.desired_replicas, "workers": replaced.get(pool.role, [])}
             for pool in deployment.pools.all()]
    return {"pools": pools, "num_replaced": sum(len(p["workers"]) for p in pools),
            "num_started": sum(p["desired"] for p in pools)}


@require_http_methods(["GET", "POST"])
@operator_required
def rollback_view(request, name: str, number: int):
    """GET: the confirmation (what will be replaced, what changes); POST: the rollback."""
    deployment = get_deployment_or_404(name)
    target = revision_get(deployment, number) if number <= MAX_ID else None
    if target is None:
        numbers = [r.number for r in revision_list(deployment)]
        raise Http404(f"deployment {name!r} has no revision {number} (it has {sorted(numbers)})")
    if request.method == "POST":
        try:
            action = deployment_rollback(deployment=deployment, revision_number=number, actor=request.user,
                                         reason=_reason(request, f"roll back to revision {number}"),
                                         idempotency_key=posted_key(request))
        except ControlPlaneError as error:
            messages.error(request, error.message)
            return redirect(reverse("dashboards:revisions", args=[name]))
        _done(request, action, f"Rolling back {name} to revision {number}")
        return _back(request, name, action)
    current = deployment.current_revision
    return page(request, "dashboards/rollback_confirm.html", {
        "deployment": deployment, "target": target, "current": current,
        "diff": revision_diff(current, target) if current else [],
        "plan": rollback_plan(deployment, target),
    })


@require_POST
@operator_required
def autoscaling_view(request, name: str):
    """Turn the deployment's autoscaler on or off, or switch its mode (`mode`: active or advisory), through the
    autoscaling app's settings service (the same as PUT /api/v1/deployments/{name}/autoscaling)."""
    deployment = get_deployment_or_404(name)
    enabled, mode = request.POST.get("enabled"), request.POST.get("mode")
    if mode is None and enabled not in ("on", "off"):
        messages.error(request, "enabled must be on or off")
        return _back(request, name)
    change = {"mode": mode[:40]} if mode is not None else {"enabled": enabled == "on"}
    try:
        confirm = _gated(request, deployment, gated_change(deployment, **change))
        if confirm is not None:
            return confirm
        autoscaling_update(deployment=deployment, actor=request.user, **change)
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, name)
    messages.success(request, f"Autoscaler of {name} " + (f"in {mode} mode." if mode else f"turned {enabled}."))
    return _back(request, name)


@require_POST
@operator_required
def advice_apply_view(request, name: str, advice_id: int):
    """Apply the autoscaler's advice (the same service as POST /api/v1/.../autoscaling/advice/{id}/apply): the
    pool scales as the operator's action naming the advice; stale advice is a message saying why."""
    deployment = get_deployment_or_404(name)
    try:
        advice, action = advice_apply(deployment=deployment, advice_id=min(advice_id, MAX_ID), actor=request.user,
                                      reason=_reason(request, "Apply button"), idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, name)
    _done(request, action, f"Applying advice #{advice.pk}: scaling {action.params['role']} from "
                           f"{action.params['from']} to {action.params['to']}")
    return _back(request, name, action)


@require_POST
@operator_required
def objectives_view(request, name: str):
    """Change the deployment's latency objectives (the same service as PATCH /api/v1/deployments/{name}/): the
    fields left empty keep their value; a bad one is a message naming it, and nothing changes."""
    deployment = get_deployment_or_404(name)
    changes = {}
    for field in DEFAULT_OBJECTIVES:
        raw = (request.POST.get(field) or "").strip()
        if not raw:
            continue
        try:
            changes[field] = float(raw)
        except ValueError:
            messages.error(request, f"objectives.{field} must be a number of seconds, not {raw[:40]!r}")
            return _back(request, name)
    try:
        action = deployment_objectives_set(deployment=deployment, objectives=changes, actor=request.user,
                                           reason=_reason(request, "objectives"))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return _back(request, name)
    _done(request, action, f"Objectives of {name} set")
    return _back(request, name, action)
