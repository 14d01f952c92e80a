from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ActionAdviceStatus(models.TextChoices):
    OPEN = "open"              # what the rule would do now: an operator may apply it
    APPLIED = "applied"        # an operator carried it out (`action`)
    SUPERSEDED = "superseded"  # withdrawn: newer advice for the same target, or the rule changed (`outcome`)
    EXPIRED = "expired"        # its alert resolved before anyone applied it


class ActionAdvice(models.Model):
    """An action an advisory rule would have carried out for a firing alert: the audit row of a decision nobody made
    yet, with the inputs it was made on (the alert's value against the rule's threshold: the margin).

    One row per firing and action while the alert keeps firing: each evaluation confirms it (`evaluated_at`,
    `num_evaluations`, the newest value) rather than adding one. At most one open row per (rule, action index,
    target), as the cooldown is per target. `basis` is the target's state the advice was made for (the pool's
    desired replicas, the worker's restarts, the deployment's revision): applying it after that changed is refused.
    """

    rule = models.ForeignKey("alerting.AlertRule", on_delete=models.CASCADE, related_name="advice")
    # History of its alert: pruned with it (services.history).
    alert = models.ForeignKey("alerting.Alert", on_delete=models.CASCADE, related_name="advice")
    action_index = models.PositiveIntegerField()
    kind = models.CharField(max_length=20)
    params = models.JSONField(default=dict)  # the rule's action entry, as it was when advised
    target = models.CharField(max_length=200)  # action_kinds.action_target: the cooldown's target
    deployment = models.ForeignKey("controlplane.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="+")
    role = models.CharField(max_length=20, blank=True, default="")
    worker = models.ForeignKey("controlplane.Worker", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    basis = models.JSONField(default=dict)
    value = models.FloatField(null=True, blank=True)  # the alert's newest value (None: no data)
    comparison = models.CharField(max_length=2)
    threshold = models.FloatField()
    detail = models.TextField(blank=True)  # the observation in the rule's words, e.g. "last(kv[60s]) = 0.93"
    reason = models.TextField()  # the reason the action's row would have carried
    status = models.CharField(max_length=16, choices=ActionAdviceStatus.choices, default=ActionAdviceStatus.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    evaluated_at = models.DateTimeField(default=timezone.now)  # the newest evaluation that confirmed it
    num_evaluations = models.PositiveIntegerField(default=1)
    settled_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(blank=True)  # why it was superseded or expired, or who applied it
    applied_by = models.CharField(max_length=150, blank=True)
    action = models.ForeignKey("controlplane.Action", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "action_index", "target"], condition=Q(status="open"),
                                    name="actionadvice_one_open_per_target"),
        ]
        indexes = [
            models.Index(fields=["rule", "-created_at"], name="actionadvice_rule_newest"),
            # The cooldown's look-up of the newest advice for a target.
            models.Index(fields=["rule", "action_index", "target", "created_at"], name="actionadvice_cooldown"),
        ]

    def __str__(self) -> str:
        return f"advice #{self.pk} {self.kind} {self.target} ({self.status})"
