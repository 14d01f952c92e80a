"""Alerts: firing, pending and recently resolved; advisory rules' open advice (operators apply it); silences
(operators); alert rules (admins edit, as in the API)."""
from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.alerting.models import Alert, AlertState
from controlplane.alerting.services.advice import advice_apply, open_advice
from controlplane.alerting.services.rules import rule_create, rule_update
from controlplane.alerting.services.silences import active_silences, silence_create, silence_expire, silence_for
from controlplane.errors import ControlPlaneError
from controlplane.selectors import MAX_ID
from dashboards.access import admin_for_writes, operator_required, viewer_required
from dashboards.forms import RuleForm, SilenceForm
from dashboards.selectors import alert_get, alerts_in_state, rule_get, rule_list, silence_get
from dashboards.views.common import page, posted_key, safe_next

RESOLVED_WINDOW = timedelta(hours=24)
MAX_ROWS = 100


@viewer_required
def alerts_page(request):
    now = timezone.now()
    deployment = (request.GET.get("deployment") or "").strip()[:63]
    silences = list(active_silences(now=now).select_related("created_by"))
    firing = list(alerts_in_state(AlertState.FIRING, deployment_name=deployment).order_by("-fired_at")[:MAX_ROWS])
    pending = list(alerts_in_state(AlertState.PENDING, deployment_name=deployment)
                   .order_by("-active_at")[:MAX_ROWS])
    for alert in firing + pending:
        alert.silenced_by = silence_for({k: str(v) for k, v in alert.labels.items()}, now=now, silences=silences)
    resolved = list(alerts_in_state(AlertState.RESOLVED, deployment_name=deployment,
                                    resolved_since=now - RESOLVED_WINDOW).order_by("-resolved_at")[:MAX_ROWS])
    return page(request, "dashboards/alerts.html", {
        "firing": firing, "pending": pending, "resolved": resolved, "silences": silences,
        "advice": open_advice(deployment_name=deployment, limit=MAX_ROWS),
        "rules": rule_list(),
        "silence_form": SilenceForm(), "deployment_filter": deployment,
    })


def silence_matchers(alert: Alert) -> list[dict]:
    """Equality matchers on every label of the alert: the silence mutes exactly this alert's label set."""
    return [{"name": name, "value": str(value), "is_regex": False, "is_equal": True}
            for name, value in sorted(alert.labels.items())]


@require_POST
@operator_required
def silence_create_view(request, alert_id: int):
    alert = alert_get(alert_id)
    if alert is None:
        raise Http404(f"alert {alert_id} does not exist")
    back = safe_next(request, reverse("dashboards:alerts"))
    form = SilenceForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
        messages.error(request, f"The silence was not created: {problems}")
        return redirect(back)
    now = timezone.now()
    try:
        silence = silence_create(matchers=silence_matchers(alert), starts_at=now,
                                 ends_at=now + timedelta(seconds=form.cleaned_data["duration_s"]),
                                 comment=form.cleaned_data["comment"], created_by=request.user)
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return redirect(back)
    messages.success(request, f"Silenced {alert.rule.name} until {silence.ends_at:%Y-%m-%d %H:%M} UTC "
                              f"(silence #{silence.pk}).")
    return redirect(back)


@require_POST
@operator_required
def advice_apply_view(request, rule_id: int, advice_id: int):
    """Apply an advisory rule's advice (the same service as POST /api/v1/alert-rules/{id}/advice/{id}/apply): the
    action is carried out as the operator's, its reason naming the advice; stale advice is a message saying why."""
    rule = rule_get(rule_id)
    if rule is None:
        raise Http404(f"alert rule {rule_id} does not exist")
    back = reverse("dashboards:alerts") + "#advice"
    try:
        advice, action = advice_apply(rule=rule, advice_id=min(advice_id, MAX_ID), actor=request.user,
                                      reason="dashboard: Apply button", idempotency_key=posted_key(request))
    except ControlPlaneError as error:
        messages.error(request, error.message)
        return redirect(back)
    messages.success(request, f"Applied advice #{advice.pk} of {rule.name}: {action.kind} (action #{action.pk}).")
    return redirect(back)


@require_POST
@operator_required
def silence_expire_view(request, silence_id: int):
    silence = silence_get(silence_id)
    if silence is None:
        raise Http404(f"silence {silence_id} does not exist")
    silence_expire(silence=silence, actor=request.user)
    messages.success(request, f"Silence #{silence.pk} expired.")
    return redirect(safe_next(request, reverse("dashboards:alerts")))


@require_http_methods(["GET", "POST"])
@admin_for_writes
def rule_edit_view(request, rule_id: int | None = None):
    """Create (no id) or edit an alert rule. Viewers and operators see the form read-only; admins save it."""
    rule = None
    if rule_id is not None:
        rule = rule_get(rule_id)
        if rule is None:
            raise Http404(f"alert rule {rule_id} does not exist")
    if request.method == "POST":
        form = RuleForm(request.POST)
        if form.is_valid():
            try:
                if rule is None:
                    rule = rule_create(**form.service_kwargs())
                else:
                    rule = rule_update(rule=rule, **form.service_kwargs())
            except ControlPlaneError as error:
                field = error.extra.get("field", "")
                form.add_error(field if field in form.fields else None, error.message)
            else:
                messages.success(request, f"Alert rule {rule.name} saved: {rule.describe()}.")
                return redirect(reverse("dashboards:alerts") + "#rules")
        status = 400
    else:
        form = RuleForm(initial=RuleForm.initial_from(rule) if rule else None)
        status = 200
    return page(request, "dashboards/rule_form.html", {"form": form, "rule": rule}, status=status)
