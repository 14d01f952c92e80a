"""Reconcile and health passes record their duration, as scraping, alert evaluation and autoscaling do, so that
the control plane's /metrics (and bench/fleet/sim_fleet.py) can say where a cycle's time goes."""
from controlplane.observability.models import CycleKind, CycleStat
from controlplane.supervision.tasks import check_health, reconcile_all


def test_a_reconcile_pass_records_its_duration(deployment):
    reconcile_all()
    reconcile_all()
    stat = CycleStat.objects.get(kind=CycleKind.RECONCILE)
    assert stat.count == 2 and stat.last_seconds > 0 and stat.sum_seconds >= stat.last_seconds


def test_a_health_pass_records_its_duration(db):
    check_health()
    stat = CycleStat.objects.get(kind=CycleKind.HEALTH)
    assert stat.count == 1 and stat.last_seconds is not None
