from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ActionKind(models.TextChoices):
    CREATE = "create"
    DELETE = "delete"
    SCALE = "scale"
    RESTART = "restart"
    DRAIN = "drain"
    ROLLBACK = "rollback"
    REVISION = "revision"
    NOTIFY = "notify"
    START = "start"
    STOP = "stop"
    FAIL = "fail"
    AUTOSCALE = "autoscale"  # the autoscaler switched on or off, or a pool's policy changed
    SILENCE = "silence"  # a silence created or expired
    UNSCHEDULABLE = "unschedulable"  # a pool's worker found no node to run on (and why)
    LABEL = "label"  # a node's labels changed
    PLACEMENT = "placement"  # a pool's node selector or per-worker request changed
    SAMPLING = "sampling"  # a deployment's sampling defaults changed
    OBJECTIVES = "objectives"  # a deployment's latency objectives (and the thresholds that follow them) changed
    ROLLOUT = "rollout"  # a canary or A/B rollout started, paused, resumed, stepped or ended
    PROMOTE = "promote"  # a rollout's revision made current: running until the old workers are replaced
    ABORT = "abort"  # a rollout aborted (by its analysis or an operator): its revision's workers drain
    TENANT = "tenant"  # a tenant, its keys or a deployment's key requirement changed (controlplane/tenants)
    HOLD = "hold"  # health restarts held: many probes timed out at once (supervision.probe_hold); running while held
    FAULT = "fault"  # a chaos fault injected or reverted by a node agent (params.event says which)
    GATEWAY = "gateway"  # a shared gateway created or deleted, or a deployment attached to or detached from one


class ActorType(models.TextChoices):
    USER = "user"
    RULE = "rule"
    AUTOSCALER = "autoscaler"
    WEBHOOK = "webhook"
    SYSTEM = "system"


class ActionStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


UNFINISHED_STATUSES = (ActionStatus.PENDING, ActionStatus.RUNNING)


class Action(models.Model):
    """The audit log: every change of desired state (and what supervision did about it) is one row.

    It outlives its deployment (SET_NULL plus `deployment_name`) so that the history of a deleted deployment stays.
    """

    kind = models.CharField(max_length=20, choices=ActionKind.choices)
    deployment = models.ForeignKey(
        "controlplane.Deployment", null=True, blank=True, on_delete=models.SET_NULL, related_name="actions"
    )
    deployment_name = models.CharField(max_length=63, blank=True)
    worker = models.ForeignKey(
        "controlplane.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="actions"
    )
    actor_type = models.CharField(max_length=20, choices=ActorType.choices)
    # Username, rule name, "autoscaler", webhook receiver or "system".
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    params = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=ActionStatus.choices, default=ActionStatus.PENDING)
    error = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    # A caller that may repeat itself (a retried task, a re-delivered webhook) passes the same key: one action.
    idempotency_key = models.CharField(max_length=255, unique=True, null=True, blank=True)
    # sha256 of the request that used the key: the same key with another request is refused, not answered with
    # this action (services.actions.action_once).
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["deployment", "created_at"], name="action_deployment_created"),
            models.Index(fields=["status"], name="action_status"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.deployment_name} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in (ActionStatus.SUCCEEDED, ActionStatus.FAILED)
