"""The autoscaler's tables, read and written by this app alone: one policy per pool (autoscaler.py, services.py), one
row of settings per deployment (its mode and its budget) and the advice it records in advisory mode (advice.py)."""
from __future__ import annotations

from django.db import models
from django.utils import timezone


class AutoscaleMetric(models.TextChoices):
    TTFT_P99 = "ttft_p99_seconds"
    ITL_P99 = "itl_p99_seconds"
    E2E_P99 = "e2e_p99_seconds"
    WAITING_PER_WORKER = "requests_waiting_per_worker"
    RUNNING_PER_WORKER = "requests_running_per_worker"
    KV_CACHE_USAGE = "kv_cache_usage_ratio"


# A queue wait target above this is no target: the gateway's longest default class deadline is 120 s.
MAX_QUEUE_WAIT_TARGET_S = 3600.0


class AutoscalingPolicy(models.Model):
    """How the autoscaler sizes one pool. It acts only while the deployment's `autoscale_enabled` and this policy's
    `enabled` are both on. `recommendations` keeps [ts, replicas] of the last scale-down stabilisation window.
    The table keeps the name the observability app gave it when it held this model."""

    pool = models.OneToOneField("controlplane.Pool", on_delete=models.CASCADE, related_name="autoscaling")
    enabled = models.BooleanField(default=True)
    metric = models.CharField(max_length=40, choices=AutoscaleMetric.choices)
    target = models.FloatField()
    # Seconds of gateway admission-queue wait (P99) that the pool bounding admission may let requests wait before it
    # scales out whatever `metric` says; None: not read (autoscaler.queue_wait_signal).
    queue_wait_target = models.FloatField(null=True, blank=True)
    recommendations = models.JSONField(default=list, blank=True)
    # A manual scale after this instant pauses the autoscaler (autoscaler.manual_pause); PUT resume sets it to now.
    resumed_at = models.DateTimeField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_decision = models.TextField(blank=True)  # the numbers of the last evaluation, shown by the API
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "observability_autoscalingpolicy"

    def __str__(self) -> str:
        return f"{self.pool} {self.metric} target {self.target}"


class AutoscaleMode(models.TextChoices):
    ACTIVE = "active"  # scales through pool_scale
    ADVISORY = "advisory"  # evaluates the same way, and records what it would scale as ScaleAdvice instead


class DeploymentAutoscaling(models.Model):
    """A deployment's autoscaler settings beside its switch (Deployment.autoscale_enabled, the core's): the mode, and
    the budget of workers its pools may hold in all (`max_workers`, None: only each pool's max_replicas), which both
    modes respect (budget.py). A deployment without a row is active and has no budget."""

    deployment = models.OneToOneField("controlplane.Deployment", on_delete=models.CASCADE, primary_key=True,
                                      related_name="+")
    mode = models.CharField(max_length=16, choices=AutoscaleMode.choices, default=AutoscaleMode.ACTIVE)
    max_workers = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"deployment #{self.deployment_id} {self.mode} budget {self.max_workers}"


class AdviceStatus(models.TextChoices):
    OPEN = "open"  # what the autoscaler would do now: an operator may apply it
    APPLIED = "applied"  # an operator scaled the pool to it (`action`)
    SUPERSEDED = "superseded"  # a later evaluation decided otherwise (`outcome` says what)


class ScaleAdvice(models.Model):
    """A scale the autoscaler would have made in advisory mode: the audit row of a decision nobody carried out yet,
    with the inputs it was made on. One row per change of mind: while each evaluation decides the same scale of
    the same size, the open row is confirmed (`evaluated_at`, `num_evaluations`) rather than repeated. At most
    advice.KEPT_PER_POOL rows per pool are kept."""

    pool = models.ForeignKey("controlplane.Pool", on_delete=models.CASCADE, related_name="+")
    from_replicas = models.PositiveIntegerField()
    to_replicas = models.PositiveIntegerField()
    metric = models.CharField(max_length=40)
    observed = models.FloatField(null=True, blank=True)  # None: no data (a queue wait or a bound decided)
    target = models.FloatField()
    ratio = models.FloatField(null=True, blank=True)  # observed / target: how far past the target, the margin
    raw = models.IntegerField(null=True, blank=True)  # HPA's recommendation before stabilisation, step and bounds
    inputs = models.JSONField(default=dict, blank=True)  # the rest of what the decision read (advice.py)
    reason = models.TextField()  # the decision's own words, as an active scale action's reason has them
    status = models.CharField(max_length=16, choices=AdviceStatus.choices, default=AdviceStatus.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    evaluated_at = models.DateTimeField(default=timezone.now)  # the newest evaluation that decided the same
    num_evaluations = models.PositiveIntegerField(default=1)
    settled_at = models.DateTimeField(null=True, blank=True)  # applied or superseded
    outcome = models.TextField(blank=True)  # why it was superseded, or who applied it
    applied_by = models.CharField(max_length=150, blank=True)
    action = models.ForeignKey("controlplane.Action", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="+")

    class Meta:
        indexes = [
            models.Index(fields=["pool", "-created_at"], name="advice_pool_newest"),
            # The autoscaler's pass and the page read the open advice of a pool: a handful among many settled rows.
            models.Index(fields=["pool"], condition=models.Q(status="open"), name="advice_open"),
        ]

    def __str__(self) -> str:
        return f"advice #{self.pk} pool #{self.pool_id} {self.from_replicas} → {self.to_replicas} {self.status}"
