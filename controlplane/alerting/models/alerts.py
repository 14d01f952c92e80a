from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class AlertState(models.TextChoices):
    PENDING = "pending"     # the condition holds, not yet for `for_s`
    FIRING = "firing"       # it held for `for_s` (or stopped holding less than keep_firing_for_s ago)
    RESOLVED = "resolved"   # it fired and stopped: history
    INACTIVE = "inactive"   # it was pending and stopped before firing: dropped without a resolve


ACTIVE_STATES = (AlertState.PENDING, AlertState.FIRING)


class Alert(models.Model):
    """One instance of a rule for one label set (deployment, role, worker), from pending until it ends.

    At most one active (pending or firing) alert per (rule, fingerprint); a later episode is a new row.
    """

    rule = models.ForeignKey("alerting.AlertRule", on_delete=models.CASCADE, related_name="alerts")
    fingerprint = models.CharField(max_length=64)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    deployment = models.ForeignKey("controlplane.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="alerts")
    role = models.CharField(max_length=20, blank=True, default="")
    worker = models.ForeignKey("controlplane.Worker", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="alerts")
    state = models.CharField(max_length=10, choices=AlertState.choices)
    value = models.FloatField(null=True, blank=True)
    active_at = models.DateTimeField()  # when the condition started to hold (pending since)
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_true_at = models.DateTimeField()  # the last evaluation where the condition held (keep_firing_for)
    last_evaluated_at = models.DateTimeField()

    class Meta:
        ordering = ["-active_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "fingerprint"], condition=Q(state__in=["pending", "firing"]),
                                    name="alert_one_active_per_fingerprint"),
        ]
        indexes = [
            # The API's list filters (state, deployment) and the evaluator's look-up of a rule's active alerts.
            models.Index(fields=["state", "deployment"], name="alert_state_deployment"),
            models.Index(fields=["rule", "state"], name="alert_rule_state"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} {self.labels} ({self.state})"


class AlertTransition(models.Model):
    """Every state change of an alert is a row (healthchecks' Flip): the history the dashboard draws."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=10, choices=AlertState.choices)
    to_state = models.CharField(max_length=10, choices=AlertState.choices)
    value = models.FloatField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["alert", "at"], name="alerttransition_alert_at")]


class RunStatus(models.TextChoices):
    DONE = "done"        # the service accepted it (its Action row says what happened next)
    SKIPPED = "skipped"  # nothing to do (e.g. the pool is already at its max)
    FAILED = "failed"    # the service refused (message in `error`)


class RuleActionRun(models.Model):
    """One action of a rule carried out for one firing. The unique idempotency key (rule, fingerprint, firing start,
    action index) makes it happen once per firing; the latest run per (rule, action index, target) is the cooldown."""

    rule = models.ForeignKey("alerting.AlertRule", on_delete=models.CASCADE, related_name="action_runs")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="action_runs")
    action_index = models.PositiveIntegerField()
    kind = models.CharField(max_length=20)
    target = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=255, unique=True)
    action = models.ForeignKey("controlplane.Action", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    status = models.CharField(max_length=10, choices=RunStatus.choices)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["rule", "action_index", "target", "created_at"],
                                name="ruleactionrun_cooldown")]


class Silence(models.Model):
    """Mutes notifications and actions of the alerts whose labels match every matcher, from starts_at to ends_at.

    matchers: [{"name": "deployment", "value": "demo", "is_regex": false, "is_equal": true}] as in Alertmanager;
    a regex is anchored at both ends. Expiring a silence sets ends_at to now.
    """

    matchers = models.JSONField()
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    comment = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-starts_at", "-id"]
        indexes = [models.Index(fields=["ends_at"], name="silence_ends_at")]

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.starts_at <= now < self.ends_at
