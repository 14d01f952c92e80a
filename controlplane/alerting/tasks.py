"""Celery tasks (the periodic passes on queue `periodic`, deliveries on `control`): thin wrappers around the
alerting services; they take ids."""
from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db import OperationalError
from django.utils import timezone

from controlplane.alerting.models import Delivery, DeliveryStatus
from controlplane.alerting.services.evaluation import evaluate_rules
from controlplane.alerting.services.history import history_prune
from controlplane.alerting.services.notifications import delivery_send
from controlplane.celery import DELIVER_WEBHOOK
from controlplane.observability.models import CycleKind
from controlplane.observability.telemetry import observe_evaluation
from controlplane.lib.single_pass import single_pass

log = logging.getLogger(__name__)

_RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10, max_retries=3)


@shared_task(name="controlplane.alerting.tasks.evaluate_rules_task", **_RETRY)
def evaluate_rules_task() -> dict:
    with single_pass(CycleKind.ALERT_EVALUATION) as mine:
        if not mine:
            return {"skipped": "another evaluation pass is running"}
        report = evaluate_rules()
    observe_evaluation(report.duration_s)
    return {"rules": report.num_rules, "instances": report.num_instances, "transitions": len(report.transitions),
            "actions": report.num_actions, "duration_s": round(report.duration_s, 4)}


@shared_task(name=DELIVER_WEBHOOK, **_RETRY)
def deliver_task(delivery_id: int) -> dict:
    delivery = delivery_send(delivery_id=delivery_id)
    return {"delivery": delivery.pk, "status": delivery.status, "attempts": delivery.attempts}


@shared_task(name="controlplane.alerting.tasks.deliveries_sweep_task", **_RETRY)
def deliveries_sweep_task() -> int:
    """Re-enqueue deliveries still pending a while after they were queued: their task was lost (the filesystem
    broker drops in-flight messages on a crash). delivery_send's claim keeps a duplicate from sending twice at once;
    one tried in the last 2 minutes is left to whoever tries it (a Celery retry, or the web process's thread that
    sends the watchdog's alerts), so a copy does not start over the tries it is still making."""
    stale = timezone.now() - timedelta(minutes=2)
    ids = list(Delivery.objects.filter(status=DeliveryStatus.PENDING, created_at__lt=stale)
               .exclude(last_attempt_at__gte=stale).values_list("id", flat=True)[:100])
    for delivery_id in ids:
        deliver_task.delay(delivery_id)
    return len(ids)


@shared_task(name="controlplane.alerting.tasks.history_prune_task", **_RETRY)
def history_prune_task() -> dict:
    return history_prune()
