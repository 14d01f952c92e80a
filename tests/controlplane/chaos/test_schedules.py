"""Game days, one driver pass at a time: a due schedule starts its experiment once (an Action row for the start),
a time outside its window or found too late is skipped, a start that the deployment refuses (a run already active,
not opted in) is a failed Action; the API creates (admin), lists and deletes them, with a 400 naming the bad field.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone as dt_timezone

import pytest

from controlplane.chaos.models import ChaosRun, ChaosSchedule
from controlplane.chaos.schedules import schedule_create, schedule_fire, schedules_start_due
from controlplane.models import Action, ActionStatus
from tests.controlplane.chaos.conftest import chaos_pass
from tests.controlplane.chaos.test_driver import steady_history

BASE = "/api/v1/deployments/demo/chaos/schedules"


def moment(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=dt_timezone.utc)


def due(experiment, admin, t: float, **fields) -> ChaosSchedule:
    """A schedule of every minute whose time came one second before `t`."""
    schedule = schedule_create(experiment=experiment, actor=admin, cron="* * * * *", **fields)
    ChaosSchedule.objects.filter(pk=schedule.pk).update(next_run_at=moment(t - 1))
    schedule.refresh_from_db()
    return schedule


@pytest.mark.django_db
def test_a_due_schedule_starts_its_experiment_once(experiment, gateway, admin, agent_inline):
    t = time.time()
    steady_history(gateway, t)
    schedule = due(experiment, admin, t, window={"cron": "* * * * *", "duration_minutes": 5})
    done = chaos_pass(now=t)
    run = ChaosRun.objects.get()
    assert done["scheduled"] == {schedule.pk: f"started run {run.pk}"}
    start = Action.objects.get(params__event="chaos_started")
    assert (start.actor, start.params["chaos_run"]) == ("chaos-schedule", run.pk)
    assert f"chaos schedule {schedule.pk}" in start.reason
    schedule.refresh_from_db()
    assert (schedule.last_run, schedule.last_outcome) == (run, f"started run {run.pk}")
    assert schedule.next_run_at > moment(t)
    # The same time again, as a second driver that read the row before the claim: it is not fired twice.
    stale = ChaosSchedule.objects.get(pk=schedule.pk)
    stale.next_run_at = moment(t - 1)
    assert schedule_fire(stale, now=moment(t)) == "taken by another driver"
    # A pass a moment later, before the next minute (at xx:59 a second later would be the next due time).
    assert schedules_start_due(now=min(t + 1, schedule.next_run_at.timestamp() - 0.01)) == {}
    assert ChaosRun.objects.count() == 1


@pytest.mark.django_db
def test_a_time_outside_its_window_or_found_too_late_is_skipped(experiment, gateway, admin):
    t = time.time()
    steady_history(gateway, t)
    # Open one minute a year, on New Year's night: never now (the window's zone is the schedule's).
    outside = due(experiment, admin, t, window={"cron": "0 0 1 1 *", "duration_minutes": 1})
    assert schedules_start_due(now=t) == {outside.pk: "outside its window"}
    ChaosSchedule.objects.filter(pk=outside.pk).update(window_cron="", next_run_at=moment(t - 3600))
    assert schedules_start_due(now=t) == {outside.pk: "missed"}
    outside.refresh_from_db()
    assert outside.last_outcome.startswith("missed") and not ChaosRun.objects.exists()


@pytest.mark.django_db
def test_a_start_the_deployment_refuses_is_a_failed_action(experiment, world, gateway, admin, operator,
                                                          agent_inline, django_capture_on_commit_callbacks):
    from controlplane.chaos.services import chaos_enable, run_start

    t = time.time()
    steady_history(gateway, t)
    with django_capture_on_commit_callbacks(execute=True):
        run_start(experiment=experiment, actor=operator)
    schedule = due(experiment, admin, t)
    assert schedules_start_due(now=t) == {schedule.pk: "refused: conflict"}
    refused = Action.objects.get(params__event="chaos_schedule_refused")
    assert refused.status == ActionStatus.FAILED and "one at a time" in refused.reason
    assert ChaosRun.objects.count() == 1

    ChaosRun.objects.update(status="finished")
    chaos_enable(deployment=world["deployment"], enabled=False, actor=admin)
    ChaosSchedule.objects.filter(pk=schedule.pk).update(next_run_at=moment(t - 1))
    assert schedules_start_due(now=t) == {schedule.pk: "refused: chaos_disabled"}
    schedule.refresh_from_db()
    assert "has not opted in" in schedule.last_outcome


@pytest.mark.django_db
def test_admins_create_list_pause_and_delete_schedules(experiment, admin_api, operator_api, viewer_api):
    body = {"experiment": "pause-decode", "cron": "0 10 * * 2", "timezone": "Europe/Paris",
            "window": {"cron": "0 9 * * 1-5", "duration_minutes": 480}}
    assert operator_api.post(BASE, body, format="json").status_code == 403
    created = admin_api.post(BASE, body, format="json")
    assert created.status_code == 201, created.content
    schedule = created.json()
    assert (schedule["timezone"], schedule["window"]["duration_minutes"]) == ("Europe/Paris", 480)
    # Tuesdays at 10:00 in Paris: 08:00 or 09:00 UTC depending on the season.
    times = [datetime.fromisoformat(t) for t in schedule["next_times"]]
    assert len(times) == 3 and all(t.weekday() == 1 and t.hour in (8, 9) for t in times)
    assert [s["id"] for s in viewer_api.get(BASE).json()] == [schedule["id"]]
    paused = admin_api.patch(f"{BASE}/{schedule['id']}", {"enabled": False}, format="json").json()
    assert (paused["enabled"], paused["next_times"]) == (False, [])
    assert operator_api.delete(f"{BASE}/{schedule['id']}").status_code == 403
    assert admin_api.delete(f"{BASE}/{schedule['id']}").status_code == 204
    assert viewer_api.get(f"{BASE}/{schedule['id']}").status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("change,field", [
    ({"experiment": "nope"}, "experiment"),
    ({"cron": "every tuesday"}, "cron"),
    ({"cron": 5}, "cron"),
    ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"window": {"cron": "0 9 * *", "duration_minutes": 60}}, "window.cron"),
    ({"window": {"cron": "0 9 * * *", "duration_minutes": 0}}, "window.duration_minutes"),
    ({"window": {"cron": "0 9 * * *"}}, "window"),
    ({"enabled": "yes"}, "enabled"),
    ({"at": "10:00"}, "at"),
])
def test_a_bad_schedule_is_a_400_naming_its_field(experiment, admin_api, change, field):
    response = admin_api.post(BASE, {"experiment": "pause-decode", "cron": "0 10 * * 2", **change}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error.get("field") == field or field in error.get("fields", {}), error
    assert not ChaosSchedule.objects.exists()


@pytest.mark.django_db
def test_deleting_the_experiment_deletes_its_schedules(experiment, admin):
    from controlplane.chaos.services import experiment_delete

    schedule_create(experiment=experiment, actor=admin, cron="0 10 * * 2")
    experiment_delete(experiment=experiment, actor=admin)
    assert not ChaosSchedule.objects.exists()

