"""At most one pass of each periodic kind at a time: a pass that finds its kind running is dropped, other kinds run,
and the kind is free again once the pass ends (in a process; across processes on PostgreSQL)."""
import pytest

from controlplane.observability.models import CycleKind, CycleStat
from controlplane.lib.single_pass import advisory_key, single_pass


def test_a_second_pass_of_a_running_kind_is_dropped_and_other_kinds_run(db):
    with single_pass(CycleKind.SCRAPE) as first:
        assert first is True
        with single_pass(CycleKind.SCRAPE) as second:
            assert second is False
        with single_pass(CycleKind.HEALTH) as other:
            assert other is True
    with single_pass(CycleKind.SCRAPE) as again:
        assert again is True


def test_the_kind_is_free_again_after_a_pass_that_raised(db):
    with pytest.raises(RuntimeError):
        with single_pass(CycleKind.RECONCILE):
            raise RuntimeError("the pass failed")
    with single_pass(CycleKind.RECONCILE) as mine:
        assert mine is True


def test_a_task_that_finds_its_pass_running_does_nothing_and_records_nothing(db):
    from controlplane.autoscaling.tasks import autoscale_cycle_task
    from controlplane.observability.tasks import scrape_cycle_task
    from controlplane.supervision.tasks import check_health, reconcile_all

    with single_pass(CycleKind.AUTOSCALE), single_pass(CycleKind.SCRAPE), single_pass(CycleKind.HEALTH), \
            single_pass(CycleKind.RECONCILE):
        assert autoscale_cycle_task() == {"skipped": "another autoscaling pass is running"}
        assert scrape_cycle_task() == {"skipped": "another scrape pass is running"}
        assert check_health() == {"skipped": ["another health pass is running"]}
        assert reconcile_all() == 0
    assert not CycleStat.objects.filter(kind__in=(CycleKind.AUTOSCALE, CycleKind.SCRAPE, CycleKind.HEALTH,
                                                  CycleKind.RECONCILE)).exists()
    assert autoscale_cycle_task()["pools"] == 0  # free again: the pass runs (no deployment has autoscaling on)
    assert CycleStat.objects.get(kind=CycleKind.AUTOSCALE).count == 1


def test_on_postgresql_a_pass_held_by_another_process_is_dropped(db):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the lock across processes is PostgreSQL's advisory lock; this run's database is "
                    f"{connection.vendor}")
    other = connection.get_new_connection(connection.get_connection_params())  # another session, as a process has
    try:
        other.autocommit = True
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [advisory_key(CycleKind.SCRAPE)])
            assert cursor.fetchone()[0] is True
        with single_pass(CycleKind.SCRAPE) as mine:
            assert mine is False
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [advisory_key(CycleKind.SCRAPE)])
        with single_pass(CycleKind.SCRAPE) as mine:
            assert mine is True
    finally:
        other.close()
