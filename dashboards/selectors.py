"""Reads of the operator pages that the REST API does not share: the views call these, the services and the
selectors of controlplane (and dashboards.fleet, dashboards.panels for the overview and the charts), never the ORM.
"""
from __future__ import annotations

from collections import Counter
from datetime import datetime

from django.db.models import QuerySet

from controlplane.alerting.models import Alert, AlertRule, AlertState, Silence
from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Action, Deployment, Worker
from controlplane.models.workers import LIVE_STATUSES, WorkerStatus
from controlplane.selectors import MAX_ID

# The order a request flows through: prefill, decode (or colocated), then the gateway.
ROLE_ORDER = {"prefill": 0, "decode": 1, "colocated": 2, "gateway": 3}


# --- the deployment page ------------------------------------------------------------------------------------------

def deployment_workers(deployment, *, stopped_since: datetime) -> list[Worker]:
    """The deployment's workers in request order, with those stopped since `stopped_since` (what just happened, a
    drain or a replaced worker, stays visible)."""
    workers = (Worker.objects.filter(deployment=deployment).select_related("node", "revision", "pool")
               .exclude(status=WorkerStatus.STOPPED, stopped_at__lt=stopped_since)
               .exclude(status=WorkerStatus.STOPPED, stopped_at__isnull=True))
    return sorted(workers, key=lambda w: (ROLE_ORDER.get(w.role, 9), w.pk))


def pool_policies(deployment) -> dict[int, AutoscalingPolicy]:
    """pool id → its autoscaling policy (pools the autoscaler never evaluated have none yet)."""
    return {p.pool_id: p for p in AutoscalingPolicy.objects.filter(pool__deployment=deployment)}


def recent_actions(deployment, *, limit: int) -> list[Action]:
    return list(Action.objects.filter(deployment=deployment).order_by("-created_at", "-id")[:limit])


def active_alerts(deployment, *, limit: int = 20) -> list[Alert]:
    """Firing, then pending alerts of the deployment, newest first."""
    return list(Alert.objects.filter(deployment=deployment, state__in=[AlertState.FIRING, AlertState.PENDING])
                .select_related("rule").order_by("state", "-active_at")[:limit])


# --- the audit log and the revision history -------------------------------------------------------------------------

def action_deployment_names() -> list[str]:
    """The deployments an action can be filtered by: existing ones, then deleted ones the audit log still names."""
    return (list(Deployment.objects.order_by("name").values_list("name", flat=True))
            + sorted(set(Action.objects.filter(deployment__isnull=True).exclude(deployment_name="")
                         .values_list("deployment_name", flat=True))))


def running_revisions(deployment) -> Counter:
    """revision number → live workers of the deployment that run it."""
    return Counter(Worker.objects.filter(deployment=deployment, status__in=LIVE_STATUSES, revision__isnull=False)
                   .values_list("revision__number", flat=True))


# --- alerts, silences and rules --------------------------------------------------------------------------------------

def alerts_in_state(state, *, deployment_name: str = "", resolved_since: datetime | None = None) -> QuerySet[Alert]:
    filters = {"deployment__name": deployment_name} if deployment_name else {}
    if resolved_since is not None:
        filters["resolved_at__gte"] = resolved_since
    return Alert.objects.filter(state=state, **filters).select_related("rule", "deployment", "worker")


def rule_list() -> list[AlertRule]:
    return list(AlertRule.objects.select_related("deployment").order_by("name"))


def alert_get(alert_id: int) -> Alert | None:
    return Alert.objects.filter(pk=alert_id).select_related("rule").first() if alert_id <= MAX_ID else None


def silence_get(silence_id: int) -> Silence | None:
    return Silence.objects.filter(pk=silence_id).first() if silence_id <= MAX_ID else None


def rule_get(rule_id: int) -> AlertRule | None:
    return AlertRule.objects.filter(pk=rule_id).select_related("deployment").first() if rule_id <= MAX_ID else None

