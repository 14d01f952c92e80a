from __future__ import annotations

import operator

from django.db import models
from django.utils import timezone


# A metric of no deployment: each control loop's age over its stale limit (observability.telemetry). Rules on it
# are fleet-level and stepped by the web process's watchdog (alerting.services.watchdog), not the evaluator pass.
CONTROL_LOOP_METRIC = "control_loop_staleness_ratio"


class Aggregation(models.TextChoices):
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    LAST = "last"


class Comparison(models.TextChoices):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    EQ = "=="
    NE = "!="


COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq,
           "!=": operator.ne}


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class ScopeRole(models.TextChoices):
    ANY = "", "every role"
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    GATEWAY = "gateway"


class AlertRule(models.Model):
    """A condition over one stored metric and what to do while it holds.

    The condition is `aggregation(metric over window_s) <comparison> threshold`. With `compare_to_offset_s` set the
    left side is the ratio of that value to the same aggregation `compare_to_offset_s` earlier ("QPS down 30%
    against the previous hour" = qps, offset 3600, `<`, 0.7). It must hold for `for_s` before the alert fires and
    the alert keeps firing `keep_firing_for_s` after it stops holding (Prometheus' semantics).
    """

    name = models.CharField(max_length=100, unique=True)
    # null: the rule applies to every deployment (one alert instance per deployment).
    deployment = models.ForeignKey("controlplane.Deployment", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="alert_rules")
    role = models.CharField(max_length=20, blank=True, default="", choices=ScopeRole.choices)
    per_worker = models.BooleanField(default=False, help_text="One alert instance per worker instead of per pool.")
    # A tenant's name: the rule reads that tenant's series (observability.catalog.TENANT_METRICS), one alert
    # instance per deployment it uses. By name, as its series are: a rule outlives a deleted tenant and then sees
    # no data.
    tenant = models.CharField(max_length=63, blank=True, default="",
                              help_text="Read this tenant's series (per deployment) instead of the pools'.")
    metric = models.CharField(max_length=64)
    aggregation = models.CharField(max_length=8, choices=Aggregation.choices, default=Aggregation.AVG)
    window_s = models.PositiveIntegerField(default=60)
    comparison = models.CharField(max_length=2, choices=Comparison.choices)
    threshold = models.FloatField()
    compare_to_offset_s = models.PositiveIntegerField(null=True, blank=True)
    for_s = models.PositiveIntegerField(default=0)
    keep_firing_for_s = models.PositiveIntegerField(default=0)
    # No sample in the window is "no data", which never fires unless this is set (an absence rule).
    fire_on_no_data = models.BooleanField(default=False)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    # [{"type": <kind>, <its params>}, ...], run in order: the kinds are alerting.services.action_kinds'.
    actions = models.JSONField(default=list, blank=True)
    cooldown_s = models.PositiveIntegerField(default=300)
    # Actions that change the fleet (every kind but notify) are recorded as ActionAdvice for an operator to apply
    # instead of being carried out; notifications still go.
    advisory = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    # Set on the rules a new deployment gets (alerting.services.defaults); they stay editable.
    default_key = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["enabled"], name="alertrule_enabled")]

    def __str__(self) -> str:
        return self.name

    def holds(self, value: float | None) -> bool:
        """Whether the condition holds for one observed value (None: no data)."""
        if value is None:
            return self.fire_on_no_data
        return COMPARE[self.comparison](value, self.threshold)

    def describe(self) -> str:
        if self.metric == CONTROL_LOOP_METRIC:  # per control loop: its age over its stale limit, right now
            return f"{self.metric}{{loop}} {self.comparison} {self.threshold:g}"
        selector = f'{{tenant="{self.tenant}"}}' if self.tenant else ""
        left = f"{self.aggregation}({self.metric}{selector}[{self.window_s}s])"
        if self.compare_to_offset_s:
            left = f"{left} / {left} offset {self.compare_to_offset_s}s"
        return f"{left} {self.comparison} {self.threshold:g}"
