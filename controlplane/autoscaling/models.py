"""The autoscaler's table: one policy per pool, read and written by this app alone (autoscaler.py, services.py)."""
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
