"""Capacity state: measured stage profiles, profiling jobs, per-pool schedules and predictive scaling settings."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone as dj_timezone


class Profile(models.Model):
    """How one stage of one revision performs on one node class, measured by `tandem_profile` and refined by live
    traffic. One row per (revision, node_class, role); a new profile run replaces the synthetic points.

    `points`: {"prefill": [{"prompt_tokens", "batch", "batch_tokens", "latency_s", "source"}],
               "decode": [{"batch", "context", "step_s", "step_p99_s", "tokens_per_s", "source"}]}
    with source "synthetic" (a profile run) or "live" (scraped metrics). `fits`: {"prefill": {a, b, c},
    "decode": {a, b, c}} (sizing/curves.py). A prefill profile has only the prefill part, a decode profile only the
    decode part, a colocated one both."""

    revision = models.ForeignKey("controlplane.Revision", on_delete=models.CASCADE, related_name="profiles")
    node_class = models.CharField(max_length=63, default="default")
    role = models.CharField(max_length=20)
    points = models.JSONField(default=dict)
    fits = models.JSONField(default=dict)
    kv_bytes_per_token = models.PositiveBigIntegerField(default=0)
    max_num_seqs = models.PositiveIntegerField(default=0)  # the largest running batch the worker accepts
    max_batch_tokens = models.PositiveIntegerField(default=0)  # prefill token budget per step
    kv_capacity_tokens = models.PositiveBigIntegerField(default=0)  # KV slots of one worker
    info = models.JSONField(default=dict)  # the profiled worker's /info
    created_at = models.DateTimeField(default=dj_timezone.now)
    updated_at = models.DateTimeField(default=dj_timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["revision", "node_class", "role"],
                                               name="profile_per_revision_class_role")]

    def __str__(self) -> str:
        return f"{self.revision} {self.role} on {self.node_class}"


class ProfileJobStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ProfileJob(models.Model):
    """One profile run (API → Celery task, or the command): its progress for the page, its outcome."""

    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE, related_name="profile_jobs")
    revision = models.ForeignKey("controlplane.Revision", on_delete=models.CASCADE, related_name="profile_jobs")
    node_class = models.CharField(max_length=63, default="default")
    quick = models.BooleanField(default=False)
    allow_shared_host = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=ProfileJobStatus.choices, default=ProfileJobStatus.PENDING)
    progress = models.FloatField(default=0.0)  # 0..1
    step = models.CharField(max_length=200, blank=True)  # what it is measuring now
    error = models.TextField(blank=True)
    profiles = models.JSONField(default=list)  # ids of the Profile rows it wrote
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=dj_timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["deployment", "-created_at"], name="profilejob_deployment")]


class PoolSchedule(models.Model):
    """A recurring window (cron start + duration, wall clock in `timezone`) during which the autoscaler keeps the
    pool within min_replicas..max_replicas (either may be null: floor only or ceiling only). Several active windows
    combine: the highest floor and the lowest ceiling; the pool's own min..max always bound them."""

    pool = models.ForeignKey("controlplane.Pool", on_delete=models.CASCADE, related_name="schedules")
    name = models.CharField(max_length=100)
    cron = models.CharField(max_length=100)
    duration_minutes = models.PositiveIntegerField()
    timezone = models.CharField(max_length=64, default="UTC")
    min_replicas = models.PositiveIntegerField(null=True, blank=True)
    max_replicas = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=dj_timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "name"], name="schedule_name_per_pool")]


class PredictiveScaling(models.Model):
    """Predictive floors for one pool: the same hours of the last `history_days` days say how much traffic comes in
    the next `lead_time_s`; the floor is that rate over what one replica carries (`requests_per_replica`, given,
    or computed from the profile when it is enabled: services.plans.requests_per_replica)."""

    pool = models.OneToOneField("controlplane.Pool", on_delete=models.CASCADE, related_name="predictive")
    enabled = models.BooleanField(default=False)
    lead_time_s = models.PositiveIntegerField(default=900)
    history_days = models.PositiveSmallIntegerField(default=7)
    requests_per_replica = models.FloatField(null=True, blank=True)
    last_floor = models.PositiveIntegerField(null=True, blank=True)
    last_forecast_rps = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(default=dj_timezone.now)
