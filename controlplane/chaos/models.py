"""Chaos experiments and their runs, the per-deployment opt-in and game days. The rows are the whole state: the
driver (driver.py) reads and advances them, so a restart of any process resumes where the rows say; the faults
themselves are carried out (and released at their deadline) by the node agent. The gateway numbers a hypothesis is
judged on are the observability app's (observability.gateway_counters)."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class ChaosSettings(models.Model):
    """A deployment's opt-in: no experiment runs on a deployment without a row here with `enabled` (off by
    default)."""

    deployment = models.OneToOneField("controlplane.Deployment", on_delete=models.CASCADE,
                                      related_name="chaos_settings")
    enabled = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")


class Experiment(models.Model):
    """What to break, for how long, and what must keep holding. The JSON fields are validated by validation.py;
    a run copies them (ChaosRun.spec), so an edit never changes a run in progress or its report."""

    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE,
                                   related_name="chaos_experiments")
    name = models.CharField(max_length=63)
    description = models.TextField(blank=True)
    # {"role": "decode", "count": 1} or {"role": "decode", "percent": 50}
    target = models.JSONField(default=dict)
    # [{"kind": "pause", "duration_s": 5}, {"kind": "kill"}]
    faults = models.JSONField(default=list)
    duration_s = models.FloatField()
    # [{"metric": "error_ratio", "max": 0.005, "window_s": 10}, {"metric": "ttft_p99_seconds",
    #   "max_baseline_ratio": 1.5}, {"metric": "ready_workers", "role": "decode", "min": 1}]
    hypothesis = models.JSONField(default=list)
    # [{"metric": "error_ratio", "above": 0.05, "window_s": 5, "for_s": 10}]
    abort_conditions = models.JSONField(default=list)
    # How long after the faults are reverted the hypothesis may take to hold again; the run fails past it.
    recovery_timeout_s = models.FloatField(default=120.0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["deployment", "name"], name="chaos_experiment_name")]

    def __str__(self) -> str:
        return f"chaos experiment {self.name} of {self.deployment_id}"

    def spec(self) -> dict:
        return {"name": self.name, "target": self.target, "faults": self.faults, "duration_s": self.duration_s,
                "hypothesis": self.hypothesis, "abort_conditions": self.abort_conditions,
                "recovery_timeout_s": self.recovery_timeout_s}


class RunStatus(models.TextChoices):
    RUNNING = "running"  # faults injected (or being injected); abort conditions and the hypothesis checked
    RECOVERING = "recovering"  # faults reverted; waiting for the hypothesis to hold again
    FINISHED = "finished"  # the report is final


class Verdict(models.TextChoices):
    PASSED = "passed"  # not aborted, and the hypothesis held again within the recovery timeout
    FAILED = "failed"  # it did not hold again in time (or a fault could not be injected)
    ABORTED = "aborted"  # an abort condition or an operator stopped it


ACTIVE_STATUSES = (RunStatus.RUNNING, RunStatus.RECOVERING)


class ChaosRun(models.Model):
    experiment = models.ForeignKey(Experiment, null=True, on_delete=models.SET_NULL, related_name="runs")
    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE, related_name="chaos_runs")
    spec = models.JSONField(default=dict)  # the experiment as it was when the run started
    status = models.CharField(max_length=12, choices=RunStatus.choices, default=RunStatus.RUNNING)
    verdict = models.CharField(max_length=10, choices=Verdict.choices, blank=True)
    # [{"worker": id, "role": r, "node": name, "pid": p}]: chosen at start
    targets = models.JSONField(default=list)
    # [{"key", "kind", "worker", "queue", "duration_s"}]: one per (fault, target), the agent's messages
    faults = models.JSONField(default=list)
    baseline = models.JSONField(default=dict)  # the hypothesis' evaluation before the fault (its values: baseline)
    # Abort conditions: {index: Unix time of the first pass that saw it breached, while it stays breached}
    breaches = models.JSONField(default=dict)
    # [{"t", "phase": "during" | "after", "holds", "values": [...], "failing": [...]}]: one per driver pass
    timeline = models.JSONField(default=list)
    started_at = models.DateTimeField(default=timezone.now)
    fault_ends_at = models.DateTimeField()
    reverted_at = models.DateTimeField(null=True, blank=True)
    recovered_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    abort_reason = models.TextField(blank=True)
    report = models.JSONField(default=dict)  # final once finished (report.py)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-id"]
        constraints = [
            # The database, not only the service, keeps one active run per deployment.
            models.UniqueConstraint(fields=["deployment"], condition=Q(status__in=["running", "recovering"]),
                                    name="one_active_chaos_run_per_deployment"),
        ]

    def __str__(self) -> str:
        return f"chaos run {self.pk} of {self.deployment_id}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


class ChaosSchedule(models.Model):
    """A game day: the experiment runs at each `cron` time (in the zone `tz`) that falls inside the allowed window
    (`window_cron` opens it for `window_minutes`, same zone; none: any time). The driver starts the due ones
    (schedules.py); a time is claimed by a conditional UPDATE of `next_run_at`, so it fires at most once however
    many drivers run. A start goes through run_start: the opt-in, one run per deployment and steady state hold."""

    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE,
                                   related_name="chaos_schedules")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="schedules")
    cron = models.CharField(max_length=100)
    tz = models.CharField(max_length=64, default="UTC")  # an IANA zone; the API calls it `timezone`
    window_cron = models.CharField(max_length=100, blank=True)
    window_minutes = models.IntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField()
    last_fired_at = models.DateTimeField(null=True, blank=True)  # the cron time it last handled
    last_outcome = models.TextField(blank=True)  # "started run 12", "outside its window", "refused: ..."
    last_run = models.ForeignKey(ChaosRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["id"]
        indexes = [
            # Read by the driver's pass: the enabled schedules whose time has come (schedules.schedules_start_due).
            models.Index(fields=["enabled", "next_run_at"], name="chaos_schedule_due"),
        ]

    def __str__(self) -> str:
        return f"chaos schedule {self.pk} of {self.experiment_id}"
