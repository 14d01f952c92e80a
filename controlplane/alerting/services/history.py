"""Pruning: ended alerts (with their transitions and action runs) and finished deliveries older than
TANDEM_ALERT_HISTORY_DAYS. A pending alert that flaps leaves one inactive row per episode, so this is not optional."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.alerting.models import Alert, AlertState, Delivery, DeliveryStatus


def history_prune(*, now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.TANDEM_ALERT_HISTORY_DAYS)
    # Deliveries first: their alert FK is SET_NULL, and a delivery is history of its own.
    num_deliveries, _ = Delivery.objects.filter(
        status__in=[DeliveryStatus.SUCCEEDED, DeliveryStatus.FAILED], created_at__lt=cutoff).delete()
    num_alerts, _ = Alert.objects.filter(state__in=[AlertState.RESOLVED, AlertState.INACTIVE],
                                         last_evaluated_at__lt=cutoff).delete()
    return {"deliveries": num_deliveries, "alert_rows": num_alerts}
