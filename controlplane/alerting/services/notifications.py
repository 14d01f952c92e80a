"""Notifications: queue one delivery per channel (rendered now, sent by a Celery task after commit, or by a thread of
this process for the control-loop watchdog), and send one delivery with bounded tries, backoff and a timeout."""
from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Callable

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.alerting.models import Alert, AlertRule, Channel, Delivery, DeliveryStatus
from controlplane.alerting.webhooks.payloads import payload_for
from controlplane.alerting.webhooks.signing import HEADER, sign
from controlplane.alerting.webhooks.transport import TransportError, post
from controlplane.celery import DELIVER_WEBHOOK, task_send
from controlplane.models import ActionKind, ActionStatus
from controlplane.services import Actor, DuplicateAction, action_create, action_find

log = logging.getLogger(__name__)


def channels_for(names: list[str] | None):
    """The enabled channels a notify action names (None or empty: every enabled channel)."""
    channels = Channel.objects.filter(enabled=True)
    if names:
        channels = channels.filter(name__in=names)
    return list(channels.order_by("name"))


def notify(*, alert: Alert, rule: AlertRule, channels: list[str] | None, event: str, reason: str,
           idempotency_key: str, now: datetime | None = None, deliver=None):
    """Record a `notify` Action (actor: the rule) and queue a delivery to each channel. Returns the Action.
    `now` is the evaluation's clock: the delivery rows carry it, so history pruning ages them on the same clock as
    the alerts they belong to. `deliver(delivery_id)` sends each after commit: delivery_enqueue (Celery, the
    default) or delivery_send_in_thread."""
    deliver = deliver or delivery_enqueue
    existing = action_find(idempotency_key)
    if existing is not None:
        return existing
    targets = channels_for(channels)
    try:
        with transaction.atomic():
            deliveries = [
                Delivery.objects.create(channel=channel, alert=alert, event=event,
                                        payload=payload_for(channel, alert, event),
                                        idempotency_key=f"{idempotency_key}:{channel.pk}",
                                        created_at=now or timezone.now())
                for channel in targets
            ]
            # Succeeded once queued: each delivery row carries its own outcome.
            action = action_create(
                kind=ActionKind.NOTIFY, actor=Actor.rule(rule.name), deployment=alert.deployment,
                worker=alert.worker, reason=reason, status=ActionStatus.SUCCEEDED,
                params={"event": event, "alert": alert.pk, "channels": [c.name for c in targets]},
                idempotency_key=idempotency_key, result={"deliveries": [d.pk for d in deliveries]})
            for delivery in deliveries:
                deliver(delivery.pk)
    except DuplicateAction as dup:
        return dup.action
    except IntegrityError:
        # A concurrent notify with this key committed its deliveries first (their keys derive from it); its Action
        # is the one.
        existing = action_find(idempotency_key)
        if existing is None:
            raise
        return existing
    return action


def channels_notify(*, idempotency_key: str, event: str, payload: Callable[[str], dict]) -> list[int]:
    """Queue one delivery of an event that is no alert's (a rollout aborted, a chaos run ended) to each enabled
    channel, its body `payload(channel kind)`, sent after commit by the delivery task. Call it inside the event's
    own transaction; the deliveries' keys are `<idempotency_key>:<channel id>`, so an event recorded twice queues
    once. Returns the deliveries' ids."""
    ids = []
    for channel in channels_for(None):
        delivery, created = Delivery.objects.get_or_create(
            idempotency_key=f"{idempotency_key}:{channel.pk}",
            defaults={"channel": channel, "event": event, "payload": payload(channel.kind)})
        if created:
            delivery_enqueue(delivery.pk)
        ids.append(delivery.pk)
    return ids


def delivery_enqueue(delivery_id: int) -> None:
    """Send the delivery after commit (by task name: the task module imports this one). A broker that is down
    leaves it pending; the sweep task sends it again."""
    transaction.on_commit(lambda: task_send(DELIVER_WEBHOOK, args=(delivery_id,)), robust=True)


def delivery_send_in_thread(delivery_id: int) -> None:
    """Send the delivery after commit from a daemon thread of this process, not through the broker (for alerts
    about the broker or Celery themselves). delivery_send's per-try claim and the sweep's skip of deliveries tried
    lately keep a later Celery copy from sending it again."""
    def send():
        try:
            delivery_send(delivery_id=delivery_id)
        except Exception:  # the row keeps its pending state; the sweep task retries it if Celery comes back
            log.exception("sending delivery %s from this process failed", delivery_id)
        finally:
            connection.close()  # this thread's own connection

    transaction.on_commit(lambda: threading.Thread(target=send, name=f"delivery-{delivery_id}", daemon=True).start(),
                          robust=True)


def _headers(channel: Channel, body: bytes) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": "Tandem-Alerting/1"}
    if channel.secrets:
        headers[HEADER] = sign(body, list(channel.secrets))
    return headers


def delivery_send(*, delivery_id: int) -> Delivery:
    """Send one delivery: up to TANDEM_WEBHOOK_MAX_ATTEMPTS tries, each with TANDEM_WEBHOOK_TIMEOUT_S, with
    exponential backoff between transient failures. A permanent error (404, 410, other 4xx) stops at once and
    disables the channel, saying why on both rows. Each try is claimed with a conditional UPDATE so that a task run
    twice (acks_late) does not send twice in parallel."""
    delivery = Delivery.objects.select_related("channel").get(pk=delivery_id)
    channel = delivery.channel
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    backoff_s = settings.TANDEM_WEBHOOK_BACKOFF_MS / 1000
    while delivery.status == DeliveryStatus.PENDING:
        if not Channel.objects.filter(pk=channel.pk, enabled=True).exists():
            _finish(delivery, DeliveryStatus.FAILED, error=f"channel {channel.name} is disabled")
            break
        claimed = Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING,
                                          attempts=delivery.attempts).update(attempts=F("attempts") + 1,
                                                                             last_attempt_at=timezone.now())
        if claimed != 1:
            break  # another process is sending it
        delivery.attempts += 1
        try:
            code = post(channel.url, body, headers=_headers(channel, body),
                        timeout_s=settings.TANDEM_WEBHOOK_TIMEOUT_S)
        except TransportError as exc:
            delivery.response_code = exc.status_code
            if exc.permanent:
                reason = f"disabled after a permanent delivery error: {exc.message}"
                _finish(delivery, DeliveryStatus.FAILED, error=f"permanent: {exc.message}; channel disabled")
                Channel.objects.filter(pk=channel.pk).update(enabled=False, disabled_reason=reason,
                                                             disabled_at=timezone.now())
                log.warning("channel %s %s", channel.name, reason)
                break
            if delivery.attempts >= settings.TANDEM_WEBHOOK_MAX_ATTEMPTS:
                _finish(delivery, DeliveryStatus.FAILED,
                        error=f"gave up after {delivery.attempts} tries: {exc.message}")
                break
            Delivery.objects.filter(pk=delivery.pk).update(error=f"try {delivery.attempts}: {exc.message}",
                                                           response_code=exc.status_code)
            time.sleep(backoff_s * 2 ** (delivery.attempts - 1))
            continue
        delivery.response_code = code
        _finish(delivery, DeliveryStatus.SUCCEEDED, error="")
    delivery.refresh_from_db()
    return delivery


def _finish(delivery: Delivery, status: str, *, error: str) -> None:
    Delivery.objects.filter(pk=delivery.pk).update(status=status, error=error, response_code=delivery.response_code,
                                                   finished_at=timezone.now())
    delivery.status = status
