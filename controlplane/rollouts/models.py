"""A rollout of a revision beside the deployment's stable one (canary steps or a fixed A/B split), and the analysis
runs that judged it. The rows are the whole state: the driver (driver.py) reads and advances them, so a restart of
any process resumes where the rows say."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.rollouts.analysis import DEFAULT_CONDITIONS


class Strategy(models.TextChoices):
    ROLLING = "rolling"  # today's replacement of both pools (a new revision); not a Rollout row
    CANARY = "canary"
    AB = "ab"


class RolloutStatus(models.TextChoices):
    RUNNING = "running"
    PAUSED = "paused"  # an operator's pause, or a canary step without a duration: waits for resume or promote
    PROMOTED = "promoted"  # its revision is current; the stable workers are replaced by the rolling machinery
    ABORTED = "aborted"  # traffic back to stable; its revision's workers drain
    COMPLETED = "completed"  # an A/B experiment that reached its end time: report final, nothing promoted


# Rollouts that hold traffic and workers: one per deployment at a time.
ACTIVE_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.PAUSED)
VARIANTS = {Strategy.CANARY: ("stable", "canary"), Strategy.AB: ("a", "b")}


class Rollout(models.Model):
    deployment = models.ForeignKey("controlplane.Deployment", on_delete=models.CASCADE, related_name="rollouts")
    strategy = models.CharField(max_length=10, choices=Strategy.choices)
    # The revision tried (canary, or B) and the one that serves the rest of the traffic (stable, or A).
    revision = models.ForeignKey("controlplane.Revision", on_delete=models.CASCADE, related_name="+")
    stable_revision = models.ForeignKey("controlplane.Revision", on_delete=models.CASCADE, related_name="+")
    # Canary: [{"weight": 10, "duration_s": 60, "analysis": true}, ...] (services.validate_steps); A/B: one step,
    # the split, whose duration is the experiment's.
    steps = models.JSONField(default=list)
    # Analysis conditions (analysis.DEFAULT_CONDITIONS filled in).
    analysis = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=RolloutStatus.choices, default=RolloutStatus.RUNNING)
    step_index = models.PositiveIntegerField(default=0)
    # When the current step's timer started: set once the revision's workers are ready (None: still waiting).
    step_started_at = models.DateTimeField(null=True, blank=True)
    # Seconds of the current step already spent before a pause (a resume continues the timer, not restarts it).
    step_elapsed_s = models.FloatField(default=0.0)
    # A/B: when the experiment ends (set when its timer starts).
    ends_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # why it ended (the failing numbers of an abort)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-id"]
        constraints = [
            # The database, not only the service, keeps one active rollout per deployment.
            models.UniqueConstraint(fields=["deployment"], condition=Q(status__in=["running", "paused"]),
                                    name="one_active_rollout_per_deployment"),
        ]

    def __str__(self) -> str:
        return f"{self.strategy} rollout {self.pk} of {self.deployment_id}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def conditions(self) -> dict:
        """The analysis conditions with the defaults filled in (a rollout started before a condition existed lacks
        it)."""
        return {**DEFAULT_CONDITIONS, **(self.analysis or {})}

    @property
    def variants(self) -> tuple[str, str]:
        """(stable's variant, the tried revision's variant)."""
        return VARIANTS[Strategy(self.strategy)]

    @property
    def current_step(self) -> dict | None:
        return self.steps[self.step_index] if self.step_index < len(self.steps) else None

    @property
    def weight(self) -> int:
        """The tried revision's share of traffic now (percent)."""
        if not self.is_active or not self.steps:
            return 0
        # Past the last step (between its end and the promotion that follows) the last weight holds.
        step = self.current_step or self.steps[-1]
        return int(step["weight"])

    def step_elapsed(self, now=None) -> float:
        """Seconds of the current step so far (paused time excluded)."""
        if self.step_started_at is None or self.status != RolloutStatus.RUNNING:
            return self.step_elapsed_s
        return self.step_elapsed_s + ((now or timezone.now()) - self.step_started_at).total_seconds()


class Verdict(models.TextChoices):
    WAITING = "waiting"  # not enough requests on either side yet: never a pass
    PASSING = "passing"  # judged, within the conditions so far; the step has time left
    PASSED = "passed"
    FAILED = "failed"
    REPORT = "report"  # an A/B report: numbers and a significance note, no verdict


class AnalysisRun(models.Model):
    """One step's comparison of the tried revision with stable over the same window (or an A/B experiment's
    report). `baseline` holds the gateway's cumulative per-revision counters at the window's start, so the numbers
    are exact increases over the window whichever process computes them; `metrics` the latest numbers per
    variant."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="analysis_runs")
    step_index = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    baseline = models.JSONField(default=dict)
    metrics = models.JSONField(default=dict)
    failures = models.JSONField(default=list)  # the conditions that failed, each with its numbers
    note = models.TextField(blank=True)  # what a waiting verdict waits for ("waiting: canary 7 of 20 requests")
    significance = models.JSONField(default=dict)
    verdict = models.CharField(max_length=10, choices=Verdict.choices, default=Verdict.WAITING)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "step_index"], name="one_analysis_run_per_step"),
        ]

