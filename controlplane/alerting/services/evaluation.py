"""One evaluation pass over every enabled rule: read the stored series, step each alert instance's state machine,
record transitions, then act on firing alerts (rule_actions) outside the state transaction.

Call `evaluate_rules(now=...)` one pass at a time in tests; Celery beat runs it every TANDEM_ALERT_EVAL_INTERVAL_S.
"""
from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.alerting.models import (ACTIVE_STATES, CONTROL_LOOP_METRIC, Alert, AlertRule, AlertState,
                                         AlertTransition)
from controlplane.alerting.services.advice import advice_expire
from controlplane.alerting.services.rule_actions import alert_act, alert_notify_resolved
from controlplane.alerting.services.silences import active_silences, silence_for
from controlplane.alerting.services.state import fingerprint, next_state
from controlplane.observability.reader import MetricsUnavailable, reader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observation:
    deployment_id: int
    deployment_name: str
    role: str
    worker_id: int | None
    value: float | None  # None: no data (or no reference value for a relative rule)
    detail: str  # how the value came about, for the action's reason
    tenant: str = ""  # the tenant whose series it is ("" for a pool's or a worker's)


@dataclass(slots=True)
class EvaluationReport:
    num_rules: int = 0
    num_instances: int = 0
    transitions: list[tuple[str, str, str, str]] = field(default_factory=list)  # (rule, fingerprint, from, to)
    num_actions: int = 0
    duration_s: float = 0.0
    held: str = ""  # why the pass evaluated no rule: the metrics backend did not answer


def _fmt(value: float | None) -> str:
    return "no data" if value is None else f"{value:.6g}"


def rule_observations(rule: AlertRule, *, now: datetime, deployment_ids: list[int] | None = None) -> list[Observation]:
    """The rule's current value for each instance in its scope (one per deployment and role, or per worker).
    `deployment_ids`: every deployment, when the caller has read them already."""
    from controlplane.models import Deployment

    if rule.deployment_id is not None:
        deployment_ids = [rule.deployment_id]
    elif deployment_ids is None:
        deployment_ids = list(Deployment.objects.order_by("id").values_list("id", flat=True))
    return read_observations(rule, now=now, deployment_ids=deployment_ids)


def read_key(rule: AlertRule) -> tuple:
    """Rules with the same key read the same series (of their own deployments): one read serves them all."""
    return (rule.metric, rule.role or None, rule.aggregation, rule.window_s, rule.per_worker,
            rule.compare_to_offset_s, rule.tenant)


def read_observations(rule: AlertRule, *, now: datetime, deployment_ids: list[int]) -> list[Observation]:
    """What `rule`'s read (read_key) observes in these deployments, in one read: per deployment and role, or per
    worker (silent workers of each deployment included, with no value); for a rule scoped to a tenant, that
    tenant's series per deployment it used in the window. A control-loop rule reads none: its instances are the
    control plane's own loops, stepped by the web process's watchdog."""
    if not deployment_ids or rule.metric == CONTROL_LOOP_METRIC:
        return []
    if rule.tenant:
        what = f'{rule.aggregation}({rule.metric}{{tenant="{rule.tenant}"}}[{rule.window_s}s])'
        read = dict(metric=rule.metric, tenant=rule.tenant, deployments=deployment_ids,
                    aggregation=rule.aggregation, window_s=rule.window_s, now=now)
        metric_values = reader().tenant_metric_values
    else:
        what = f"{rule.aggregation}({rule.metric}[{rule.window_s}s])"
        read = dict(metric=rule.metric, deployments=deployment_ids, role=rule.role or None,
                    aggregation=rule.aggregation, window_s=rule.window_s, now=now, per_worker=rule.per_worker)
        metric_values = reader().metric_values
    current = metric_values(**read)
    if rule.compare_to_offset_s:
        earlier = {(v.deployment_id, v.role, v.worker_id): v.value
                   for v in metric_values(**read, offset_s=rule.compare_to_offset_s)}
    observations = []
    for value in current:
        if rule.compare_to_offset_s:
            reference = earlier.get((value.deployment_id, value.role, value.worker_id))
            ratio = (value.value / reference) if value.value is not None and reference else None
            detail = (f"{what} = {_fmt(value.value)}, {_fmt(reference)} {rule.compare_to_offset_s}s earlier: "
                      f"ratio {_fmt(ratio)}")
            observed = ratio
        else:
            observed = value.value
            detail = f"{what} = {_fmt(value.value)}"
        observations.append(Observation(value.deployment_id, value.deployment_name, value.role,
                                        value.worker_id, observed, detail, rule.tenant))
    return observations


def _observations_by_rule(rules: list[AlertRule], *, now: datetime, deployment_ids: list[int]) -> dict:
    """rule id -> its observations, from one read per read_key instead of one per rule (a default rule set per
    deployment makes hundreds of rules that read a handful of series). A group whose read fails is left out: its
    rules read (and fail, logged) one by one."""
    groups: dict[tuple, list[AlertRule]] = defaultdict(list)
    for rule in rules:
        groups[read_key(rule)].append(rule)
    out: dict[int, list[Observation]] = {}
    for group in groups.values():
        scope = (deployment_ids if any(r.deployment_id is None for r in group)
                 else sorted({r.deployment_id for r in group}))
        try:
            observations = read_observations(group[0], now=now, deployment_ids=scope)
        except MetricsUnavailable:
            raise  # every read would fail alike: the pass holds (evaluate_rules)
        except Exception:
            log.exception("reading %s for %d alert rules failed", read_key(group[0]), len(group))
            continue
        by_deployment: dict[int, list[Observation]] = defaultdict(list)
        for obs in observations:
            by_deployment[obs.deployment_id].append(obs)
        for rule in group:
            out[rule.id] = observations if rule.deployment_id is None else by_deployment[rule.deployment_id]
    return out


def alert_labels(rule: AlertRule, obs: Observation) -> dict[str, str]:
    # The rule's own labels first: they must not overwrite the identity of the instance.
    labels = {str(k): str(v) for k, v in (rule.labels or {}).items()}
    labels.update({"alertname": rule.name, "severity": rule.severity, "deployment": obs.deployment_name,
                   "role": obs.role})
    if obs.worker_id is not None:
        labels["worker"] = str(obs.worker_id)
    if obs.tenant:
        labels["tenant"] = obs.tenant
    return labels


_TEMPLATE = re.compile(r"\{\{\s*\$(value|labels\.([A-Za-z_][A-Za-z0-9_]*))\s*\}\}")


def render_annotations(annotations: dict, labels: dict[str, str], value: float | None) -> dict[str, str]:
    """Prometheus' `{{ $value }}` and `{{ $labels.name }}` (the only template forms supported), so that the same
    annotations work here and in the exported Prometheus rule file."""
    def substitute(match: re.Match) -> str:
        if match.group(2):
            return labels.get(match.group(2), "")
        return _fmt(value)

    return {str(k): _TEMPLATE.sub(substitute, str(v)) for k, v in (annotations or {}).items()}


def evaluate_rules(*, now: datetime | None = None) -> EvaluationReport:
    """One pass over every enabled rule (numbered steps in rule_evaluate). A rule that fails is logged and skipped:
    one broken rule must not stop the others."""
    started = time.monotonic()
    now = now or timezone.now()
    report = EvaluationReport()
    from controlplane.models import Deployment

    silences = list(active_silences(now=now))
    # Read once per pass, not once per rule: at hundreds of rules these two reads were most of a pass's queries.
    deployment_ids = list(Deployment.objects.order_by("id").values_list("id", flat=True))
    active_by_rule: dict[int, list[Alert]] = defaultdict(list)
    for alert in Alert.objects.filter(state__in=ACTIVE_STATES, rule__enabled=True):
        active_by_rule[alert.rule_id].append(alert)
    # Control-loop rules are stepped by the web process's watchdog: this pass may be the loop that is stale.
    rules = list(AlertRule.objects.filter(enabled=True).exclude(metric=CONTROL_LOOP_METRIC)
                 .select_related("deployment").order_by("id"))
    try:
        observed = _observations_by_rule(rules, now=now, deployment_ids=deployment_ids)
    except MetricsUnavailable as exc:
        # Missing data is not "the condition no longer holds": no alert moves (fires, resolves) until the backend
        # answers again. Alerts of disabled rules still close below (that needs no data).
        log.warning("alert evaluation held, no rule evaluated: %s", exc)
        report.held, rules = str(exc), []
    for rule in rules:
        report.num_rules += 1
        try:
            rule_evaluate(rule, now=now, silences=silences, report=report, deployment_ids=deployment_ids,
                          active=active_by_rule.get(rule.id, []), observations=observed.get(rule.id))
        except Exception:
            log.exception("alert rule %r failed to evaluate", rule.name)
    _close_alerts_of_disabled_rules(now=now, silences=silences, report=report)
    report.duration_s = time.monotonic() - started
    return report


def _close_alerts_of_disabled_rules(*, now: datetime, silences: list, report: EvaluationReport) -> None:
    """A rule that was disabled (API or Django admin) leaves no alert pending or firing: pending ones are dropped,
    firing ones resolve (and say so to the channels that were told they fired)."""
    stale = Alert.objects.filter(state__in=ACTIVE_STATES, rule__enabled=False).select_related("rule")
    for alert in stale:
        alert, previous = alert_step(alert.rule, alert, alert.labels, alert.fingerprint, None, now=now,
                                     report=report, keep_firing_for_s=0)
        if alert is not None and previous == AlertState.FIRING:
            advice_expire(alert=alert, now=now)
        if alert is not None and previous == AlertState.FIRING and not silence_for(alert.labels, now=now,
                                                                                    silences=silences):
            report.num_actions += alert_notify_resolved(alert=alert, rule=alert.rule, now=now)


def rule_evaluate(rule: AlertRule, *, now: datetime, silences: list, report: EvaluationReport,
                  deployment_ids: list[int] | None = None, active: list[Alert] | None = None,
                  observations: list[Observation] | None = None) -> None:
    """1. Read the rule's observations. 2. Step each instance (and each active alert whose series vanished, as
    "not holding"). 3. Act on firing alerts and notify resolved ones, unless silenced.

    `deployment_ids` (every deployment) and `active` (this rule's pending and firing alerts) may be read once for a
    whole pass by the caller; each alert_step is conditional on the state it read, so a stale read is harmless.
    `observations`: read for a whole pass too (_observations_by_rule)."""
    if observations is None:
        observations = rule_observations(rule, now=now, deployment_ids=deployment_ids)
    if active is None:
        active = Alert.objects.filter(rule=rule, state__in=ACTIVE_STATES)
    active = {a.fingerprint: a for a in active}
    steps = []
    for obs in observations:
        labels = alert_labels(rule, obs)
        fp = fingerprint(labels)
        steps.append((active.pop(fp, None), labels, fp, obs))
    for fp, alert in active.items():
        steps.append((alert, alert.labels, fp, None))
    for alert, labels, fp, obs in steps:
        report.num_instances += 1
        alert, previous = alert_step(rule, alert, labels, fp, obs, now=now, report=report)
        if alert is None:
            continue
        if alert.state == AlertState.RESOLVED and previous == AlertState.FIRING:
            advice_expire(alert=alert, now=now)  # silenced or not: the advice is no longer what the rule would do
        silence = silence_for(alert.labels, now=now, silences=silences)
        if silence is not None:
            continue
        if alert.state == AlertState.FIRING:
            detail = obs.detail if obs is not None else "no current value"
            report.num_actions += alert_act(alert=alert, rule=rule, detail=detail, now=now)
        elif alert.state == AlertState.RESOLVED and previous == AlertState.FIRING:
            report.num_actions += alert_notify_resolved(alert=alert, rule=rule, now=now)


def alert_step(rule, alert, labels, fp, obs, *, now, report, keep_firing_for_s: int | None = None):
    """Apply one evaluation to one instance; returns (alert or None, its state before). Also the control-loop
    watchdog's step (alerting.services.watchdog), whose instances have no deployment."""
    value = obs.value if obs is not None else None
    holds = obs is not None and rule.holds(value)
    if alert is None:
        if not holds:
            return None, None
        step = next_state(state=AlertState.INACTIVE, holds=True, now=now, active_at=None, last_true_at=None,
                          for_s=rule.for_s, keep_firing_for_s=rule.keep_firing_for_s)
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    rule=rule, fingerprint=fp, labels=labels,
                    annotations=render_annotations(rule.annotations, labels, value),
                    deployment_id=obs.deployment_id, role=obs.role, worker_id=obs.worker_id, state=step.state,
                    value=value, active_at=now, fired_at=now if step.state == AlertState.FIRING else None,
                    last_true_at=now, last_evaluated_at=now)
                AlertTransition.objects.create(alert=alert, from_state=AlertState.INACTIVE, to_state=step.state,
                                               value=value, at=now)
        except IntegrityError:
            # A concurrent pass created this instance first (one active alert per fingerprint); it owns it.
            return None, None
        report.transitions.append((rule.name, fp, AlertState.INACTIVE, step.state))
        return alert, AlertState.INACTIVE

    previous = AlertState(alert.state)
    if keep_firing_for_s is None:
        keep_firing_for_s = rule.keep_firing_for_s
    step = next_state(state=previous, holds=holds, now=now, active_at=alert.active_at,
                      last_true_at=alert.last_true_at, for_s=rule.for_s, keep_firing_for_s=keep_firing_for_s)
    fields = {"last_evaluated_at": now, "last_true_at": step.last_true_at or alert.last_true_at}
    if obs is not None:
        fields["value"] = value
        if holds:
            fields["annotations"] = render_annotations(rule.annotations, alert.labels, value)
    if step.state != previous:
        fields["state"] = step.state
        if step.state == AlertState.FIRING:
            fields["fired_at"] = now
        elif step.state == AlertState.RESOLVED:
            fields["resolved_at"] = now
    with transaction.atomic():
        # Conditional on the state read: a concurrent pass that already moved it wins; this one leaves it.
        num_updated = Alert.objects.filter(pk=alert.pk, state=previous).update(**fields)
        if num_updated != 1:
            return None, None
        if step.state != previous:
            AlertTransition.objects.create(alert=alert, from_state=previous, to_state=step.state,
                                           value=fields.get("value", alert.value), at=now)
    for name, new in fields.items():
        setattr(alert, name, new)
    if step.state != previous:
        report.transitions.append((rule.name, fp, previous, step.state))
    return alert, previous
