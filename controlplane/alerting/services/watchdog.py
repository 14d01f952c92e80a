"""The control-loop watchdog: a fleet-level alert on the control plane's own periodic passes, evaluated by the web
process on its /healthz probes rather than by the evaluator pass it watches.

A stale control loop is no deployment's series, and the loop that is stale may be alert evaluation itself, or the
broker and Celery beat that drive every pass. Load balancers and `tandem_run` probe /healthz every few seconds and
/healthz reads each pass's age already (telemetry.cycle_freshness), so each web process steps the enabled
control-loop rules there, at most once per WATCHDOG_INTERVAL_S:

1. One alert instance per rule and loop kind (labels alertname, severity, loop), valued by the loop's staleness
   ratio (its age over its stale limit, 5 intervals): the rule's threshold 1 is "stale", 2 "twice as late".
2. The instance moves through evaluation.alert_step, whose create is guarded by the one-active-alert constraint and
   whose transitions are conditional UPDATEs: of many web processes probing at once, one fires it and one
   resolves it.
3. The rule's notify actions run through rule_actions as any rule's (one Action row per firing, the audit log),
   but each delivery is sent from a daemon thread of this process (notifications.delivery_send_in_thread), with
   the same bounded tries and timeout: the Celery delivery path may be what is broken.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.utils import timezone

from controlplane.alerting.models import ACTIVE_STATES, CONTROL_LOOP_METRIC, Alert, AlertRule, AlertState
from controlplane.alerting.services.evaluation import EvaluationReport, Observation, alert_step
from controlplane.alerting.services.notifications import delivery_send_in_thread
from controlplane.alerting.services.rule_actions import alert_act, alert_notify_resolved
from controlplane.alerting.services.silences import active_silences, silence_for
from controlplane.alerting.services.state import fingerprint

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 5.0  # probes come every few seconds from every load balancer: one step per this long
# The default rule (migration 0005 creates it; it stays editable and may be disabled like any rule).
CONTROL_LOOP_RULE = {
    "name": "control-plane:control-loop-stale", "default_key": "control-loop-stale", "metric": CONTROL_LOOP_METRIC,
    "aggregation": "last", "window_s": 60, "comparison": ">", "threshold": 1.0, "for_s": 0, "severity": "critical",
    "actions": [{"type": "notify"}], "cooldown_s": 0,
    "annotations": {"summary": "The control plane's {{ $labels.loop }} pass has not run for {{ $value }} × its "
                               "stale limit (5 intervals): is the broker, Celery beat or the control worker down?"},
}

_lock = threading.Lock()
_last_run = 0.0


def watchdog_labels(rule: AlertRule, loop: str) -> dict[str, str]:
    labels = {str(k): str(v) for k, v in (rule.labels or {}).items()}
    labels.update({"alertname": rule.name, "severity": rule.severity, "loop": loop})
    return labels


def control_loops_check(*, freshness: dict[str, dict], now: datetime | None = None) -> EvaluationReport:
    """Step every enabled control-loop rule on `freshness` (telemetry.cycle_freshness) now. Tests call it
    directly; /healthz calls control_loops_check_due."""
    now = now or timezone.now()
    report = EvaluationReport()
    rules = list(AlertRule.objects.filter(enabled=True, metric=CONTROL_LOOP_METRIC))
    if not rules:
        return report
    active = {(a.rule_id, a.fingerprint): a
              for a in Alert.objects.filter(rule__in=rules, state__in=ACTIVE_STATES).select_related("rule")}
    silences = None
    for rule in rules:
        report.num_rules += 1
        for loop, state in sorted(freshness.items()):
            labels = watchdog_labels(rule, loop)
            fp = fingerprint(labels)
            ratio = state["age_s"] / state["stale_after_s"]
            detail = (f"no {loop} pass for {state['age_s']:.0f} s, {ratio:.2f} × its stale limit of "
                      f"{state['stale_after_s']:.0f} s")
            obs = Observation(None, "", "", None, round(ratio, 3), detail)
            alert = active.pop((rule.pk, fp), None)
            if alert is None and not rule.holds(obs.value):
                continue  # the usual case: a fresh loop and no alert, no write
            report.num_instances += 1
            alert, previous = alert_step(rule, alert, labels, fp, obs, now=now, report=report)
            if alert is None or alert.state == previous and alert.state != AlertState.FIRING:
                continue
            if silences is None:
                silences = list(active_silences(now=now))
            if silence_for(alert.labels, now=now, silences=silences) is not None:
                continue
            if alert.state == AlertState.FIRING:
                report.num_actions += alert_act(alert=alert, rule=rule, detail=detail, now=now,
                                                deliver=delivery_send_in_thread)
            elif alert.state == AlertState.RESOLVED and previous == AlertState.FIRING:
                report.num_actions += alert_notify_resolved(alert=alert, rule=rule, now=now,
                                                            deliver=delivery_send_in_thread)
    for alert in active.values():  # a loop no longer expected (e.g. scrape under the Prometheus backend)
        alert, previous = alert_step(alert.rule, alert, alert.labels, alert.fingerprint, None, now=now,
                                     report=report, keep_firing_for_s=0)
        if alert is not None and previous == AlertState.FIRING:
            report.num_actions += alert_notify_resolved(alert=alert, rule=alert.rule, now=now,
                                                        deliver=delivery_send_in_thread)
    return report


def control_loops_check_due(*, freshness: dict[str, dict]) -> None:
    """control_loops_check at most once per WATCHDOG_INTERVAL_S in this process, never two at once, never
    raising: a probe must answer whatever the watchdog meets (a read-only database refuses its writes)."""
    global _last_run
    if time.monotonic() - _last_run < WATCHDOG_INTERVAL_S or not _lock.acquire(blocking=False):
        return
    try:
        _last_run = time.monotonic()
        report = control_loops_check(freshness=freshness)
        for rule, _, before, after in report.transitions:
            log.warning("control-loop watchdog: %s %s -> %s", rule, before, after)
    except Exception as exc:  # the probe's answer matters more; the next probe tries again
        log.warning("control-loop watchdog failed: %s: %s", type(exc).__name__, exc)
    finally:
        _lock.release()


def on_healthz_probed(sender, *, freshness: dict[str, dict], **kwargs) -> None:
    """The receiver of /healthz's `probed` signal (connected in AlertingConfig.ready)."""
    control_loops_check_due(freshness=freshness)
