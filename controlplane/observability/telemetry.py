"""The control plane's own metrics: durations of its periodic work, scrape targets up, actions and deliveries.

The work runs in Celery processes while /metrics is served by the web process, so durations are written to the
database (one CycleStat row per kind, a cumulative histogram) and read back by a collector at scrape time, as are
the action and delivery counts. No multiprocess directory to configure, nothing lost when a worker process restarts.

For other apps (alerting):
    from controlplane.observability.telemetry import observe_evaluation
    observe_evaluation(seconds)                      # one alert-rule evaluation pass
    record_cycle(CycleKind.ROLLUP, seconds)          # any other kind of CycleKind
"""
from __future__ import annotations

import bisect
import logging

from django.apps import apps
from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from controlplane.observability.models import CycleKind, CycleStat

log = logging.getLogger(__name__)

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def record_cycle(kind: str, seconds: float, *, num_targets: int | None = None, num_up: int | None = None,
                 shard=None) -> None:
    """Add one duration to the kind's histogram (a row lock: cycles of one kind are seconds apart). With a scrape
    shard (store.Shard of more than one), its targets replace that shard's part and the totals are the parts'
    sums: the targets of the latest pass of each shard."""
    with transaction.atomic():
        stat, _ = CycleStat.objects.select_for_update().get_or_create(kind=kind)
        buckets = list(stat.buckets) if len(stat.buckets) == len(DURATION_BUCKETS) else [0] * len(DURATION_BUCKETS)
        for index in range(bisect.bisect_left(DURATION_BUCKETS, seconds), len(DURATION_BUCKETS)):
            buckets[index] += 1
        stat.buckets = buckets
        stat.count += 1
        stat.sum_seconds += seconds
        stat.last_seconds = seconds
        stat.last_at = timezone.now()
        if num_targets is not None and shard is not None and shard.of > 1:
            parts = stat.shard_targets if stat.shard_targets.get("of") == shard.of else {"of": shard.of, "parts": {}}
            parts["parts"][str(shard.index)] = [num_targets, num_up or 0]
            stat.shard_targets = parts
            num_targets = sum(n for n, _ in parts["parts"].values())
            num_up = sum(up for _, up in parts["parts"].values())
        elif num_targets is not None:
            stat.shard_targets = {}
        if num_targets is not None:
            stat.last_targets, stat.last_targets_up = num_targets, num_up
        stat.save()


def expected_intervals() -> dict[str, float]:
    """How often each periodic pass is meant to run (the kinds a stale control plane shows first)."""
    from django.conf import settings

    expected = {CycleKind.RECONCILE: settings.TANDEM_RECONCILE_INTERVAL_S,
                CycleKind.HEALTH: settings.TANDEM_RECONCILE_INTERVAL_S,
                CycleKind.SCRAPE: settings.TANDEM_SCRAPE_INTERVAL_S,
                CycleKind.ALERT_EVALUATION: settings.TANDEM_ALERT_EVAL_INTERVAL_S}
    if settings.TANDEM_METRICS_BACKEND == "prometheus":
        del expected[CycleKind.SCRAPE]  # Prometheus scrapes: Tandem runs no scrape pass
    return expected


def stale_after_s(interval_s: float) -> float:
    """A pass is stale when none ran for 5 of its intervals, and never sooner than 30 s (a busy host delays a few)."""
    return max(5 * float(interval_s), 30.0)


def cycle_freshness(since: float) -> dict[str, dict]:
    """{kind: {"age_s", "stale_after_s", "stale"}} for each periodic pass; `since` (epoch seconds, the caller's
    start) stands in for a pass that never ran, so a control plane that just started is not called stale."""
    now = timezone.now().timestamp()
    last = dict(CycleStat.objects.filter(last_at__isnull=False).values_list("kind", "last_at"))
    freshness = {}
    for kind, interval in expected_intervals().items():
        ran = last.get(kind)
        age = now - (ran.timestamp() if ran is not None else since)
        limit = stale_after_s(interval)
        freshness[str(kind)] = {"age_s": round(age, 1), "ran": ran is not None, "stale_after_s": limit,
                                "stale": age > limit}
    return freshness


def observe_evaluation(seconds: float) -> None:
    """One pass of alert-rule evaluation took `seconds` (called by the alerting app)."""
    record_cycle(CycleKind.ALERT_EVALUATION, seconds)


class ControlPlaneCollector(Collector):
    """Reads the database at scrape time: nothing to keep in sync between processes."""

    def describe(self):
        return []  # no collect() at registration time (it needs the database)

    def collect(self):
        duration = HistogramMetricFamily(
            "tandem_controlplane_cycle_duration_seconds",
            "Duration of the control plane's periodic work, by kind (scrape, autoscale, alert_evaluation, rollup, reconcile, health).",
            labels=["kind"])
        last = GaugeMetricFamily("tandem_controlplane_cycle_last_duration_seconds",
                                 "Duration of the latest cycle of each kind.", labels=["kind"])
        ran_at = GaugeMetricFamily("tandem_controlplane_cycle_last_run_timestamp_seconds",
                                   "When the latest cycle of each kind ended (Unix time): time() minus it is how "
                                   "stale that control loop is.", labels=["kind"])
        targets = GaugeMetricFamily("tandem_controlplane_scrape_targets",
                                    "Targets in the latest scrape cycle, by whether they answered.", labels=["up"])
        for stat in CycleStat.objects.all():
            if len(stat.buckets) == len(DURATION_BUCKETS):
                buckets = [(str(le), float(n)) for le, n in zip(DURATION_BUCKETS, stat.buckets)]
                buckets.append(("+Inf", float(stat.count)))
                duration.add_metric([stat.kind], buckets, stat.sum_seconds)
            if stat.last_seconds is not None:
                last.add_metric([stat.kind], stat.last_seconds)
            if stat.last_at is not None:
                ran_at.add_metric([stat.kind], stat.last_at.timestamp())
            if stat.kind == CycleKind.SCRAPE and stat.last_targets is not None:
                targets.add_metric(["1"], float(stat.last_targets_up or 0))
                targets.add_metric(["0"], float(stat.last_targets - (stat.last_targets_up or 0)))
        yield duration
        yield last
        yield ran_at
        yield targets
        yield self._actions()
        yield self._unschedulable()
        deliveries = self._deliveries()
        if deliveries is not None:
            yield deliveries

    def _actions(self):
        from controlplane.models import Action

        family = CounterMetricFamily("tandem_controlplane_actions", "Actions (the audit log) by kind, actor type "
                                     "and status.", labels=["kind", "actor_type", "status"])
        rows = Action.objects.values_list("kind", "actor_type", "status").annotate(n=Count("id")).order_by()
        for kind, actor_type, status, n in rows:
            family.add_metric([kind, actor_type, status], float(n))
        return family

    def _unschedulable(self):
        from controlplane.models import Pool

        family = GaugeMetricFamily("tandem_pool_unschedulable_replicas", "Workers of a pool that no node can take "
                                   "(its selector and per-worker request fit no online node).",
                                   labels=["deployment", "role"])
        for deployment, role, num in Pool.objects.values_list("deployment__name", "role", "unschedulable_replicas"):
            family.add_metric([deployment, role], float(num))
        return family

    def _deliveries(self):
        # The alerting app is optional here: its Delivery model is read only when it is installed.
        if not apps.is_installed("controlplane.alerting"):
            return None
        try:
            delivery = apps.get_model("alerting", "Delivery")
            rows = delivery.objects.values_list("status").annotate(n=Count("id")).order_by()
            family = CounterMetricFamily("tandem_controlplane_deliveries", "Webhook deliveries by status.",
                                         labels=["status"])
            for status, n in rows:
                family.add_metric([str(status)], float(n))
            return family
        except Exception as exc:  # a model without `status`: the rest of /metrics still answers
            log.warning("cannot count alerting deliveries: %s", exc)
            return None


# One registry for the web process's /metrics; other apps may register their own collectors on it.
REGISTRY = CollectorRegistry()
REGISTRY.register(ControlPlaneCollector())
