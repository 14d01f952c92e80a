from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook"            # generic JSON, signed (Tandem-Signature)
    SLACK = "slack"                # {"text", "blocks"} for a Slack incoming webhook or a compatible receiver
    ALERTMANAGER = "alertmanager"  # Alertmanager's webhook v4 JSON, for receivers written for Alertmanager


class Channel(models.Model):
    """Where notifications go. A permanent delivery error (404, 410, other 4xx) disables it with the reason."""

    name = models.SlugField(max_length=63, unique=True)
    kind = models.CharField(max_length=20, choices=ChannelKind.choices)
    url = models.URLField(max_length=2000)
    # Signing secrets, current first. Two during a rotation: each signs (v1=... twice) so the receiver may check
    # either while it switches.
    secrets = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Delivery(models.Model):
    """One notification to one channel. The body is rendered when it is queued, so every try sends the same bytes."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    alert = models.ForeignKey("alerting.Alert", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="deliveries")
    event = models.CharField(max_length=10)  # firing | resolved
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    idempotency_key = models.CharField(max_length=255, unique=True, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["channel", "created_at"], name="delivery_channel_created"),
            # Read by the sweep that re-enqueues deliveries whose task was lost (a crashed worker).
            models.Index(fields=["created_at"], condition=Q(status="pending"), name="delivery_pending"),
        ]
