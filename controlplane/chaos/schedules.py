"""Game days: schedules that run an experiment at cron times inside an allowed window, and the driver's step that
starts the due ones.

A schedule's times and its window are cron expressions read in one time zone by the capacity app's windows
(controlplane.capacity.sizing.windows: wall-clock times, DST-safe). Each driver pass (schedules_start_due):
1. Claims each enabled schedule whose `next_run_at` has come by a conditional UPDATE that moves it to the next cron
   time after now: two drivers, or a driver killed mid-pass, never fire one time twice (at most once: a driver that
   dies between the claim and the start loses that time, which the next time makes up for).
2. A time older than MISSED_GRACE_S (the control plane was away) is skipped as missed rather than run late, and one
   outside the window is skipped: a game day runs when people expect it.
3. Otherwise starts a run through run_start, so the opt-in, one run per deployment and the steady-state check hold
   as for an operator's start; the run's `start` Action names the schedule. A refusal (not opted in, another run
   active, not in steady state) is a failed `start` Action with Tandem's reason, and the schedule's `last_outcome`.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone as dt_timezone

from django.db import transaction
from django.utils import timezone

from controlplane.capacity.sizing.windows import Window, WindowError, zone_of
from controlplane.chaos.models import ChaosSchedule, Experiment
from controlplane.chaos.services import run_start
from controlplane.errors import ControlPlaneError, invalid
from controlplane.models import ActionKind, ActionStatus
from controlplane.services.actions import Actor, action_create, as_actor

log = logging.getLogger(__name__)
MISSED_GRACE_S = 300  # a cron time found later than this is skipped, not run late
SCHEDULER = Actor.system("chaos-schedule")
_DAY_WINDOW_MIN = 1  # the length of the Window that carries a schedule's own cron times: only its starts are read


def _window(cron, duration, tz: str, field: str) -> Window:
    """A Window, with WindowError's field named as this API names it."""
    try:
        return Window(cron, duration, tz)
    except WindowError as error:
        name = {"cron": f"{field}.cron" if field else "cron", "duration_minutes": f"{field}.duration_minutes",
                "timezone": "timezone"}[error.field]
        raise invalid(f"{name}: {error}", field=name) from None


def _times(schedule: ChaosSchedule) -> Window:
    """The schedule's cron times as a Window (its length is unused: only the starts count)."""
    return Window(schedule.cron, _DAY_WINDOW_MIN, schedule.tz)


def _allowed(schedule: ChaosSchedule, at: datetime) -> bool:
    if not schedule.window_cron:
        return True
    return Window(schedule.window_cron, schedule.window_minutes, schedule.tz).is_active(at)


def schedule_create(*, experiment: Experiment, actor, cron, timezone_name="UTC", window=None,
                    enabled=True) -> ChaosSchedule:
    """A schedule of `experiment` (400 naming the bad field: cron, timezone, window.cron, window.duration_minutes,
    enabled). `window`: {"cron": "0 9 * * 1-5", "duration_minutes": 480}, or None for any time."""
    actor = as_actor(actor)
    if not isinstance(timezone_name, str):
        raise invalid("timezone must be an IANA zone name such as UTC or Europe/Paris", field="timezone")
    try:
        zone_of(timezone_name)
    except WindowError as error:
        raise invalid(str(error), field="timezone") from None
    if not isinstance(cron, str):
        raise invalid("cron must be a 5-field cron expression such as \"0 10 * * 2\"", field="cron")
    times = _window(cron, _DAY_WINDOW_MIN, timezone_name, "")
    window_cron, window_minutes = "", None
    if window is not None:
        if not isinstance(window, dict) or set(window) != {"cron", "duration_minutes"}:
            raise invalid("window must be {\"cron\": \"0 9 * * 1-5\", \"duration_minutes\": 480}", field="window")
        if not isinstance(window["cron"], str):
            raise invalid("window.cron must be a 5-field cron expression", field="window.cron")
        allowed = _window(window["cron"], window["duration_minutes"], timezone_name, "window")
        window_cron, window_minutes = allowed.cron, allowed.duration_min
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false", field="enabled")
    return ChaosSchedule.objects.create(
        deployment=experiment.deployment, experiment=experiment, cron=times.cron, tz=timezone_name,
        window_cron=window_cron, window_minutes=window_minutes, enabled=enabled,
        next_run_at=times.next_start(timezone.now()), created_by=actor.user)


def schedule_set_enabled(*, schedule: ChaosSchedule, enabled, actor) -> ChaosSchedule:
    """Pause or resume a schedule; resuming counts its times from now (none missed meanwhile is run)."""
    as_actor(actor)
    if not isinstance(enabled, bool):
        raise invalid("enabled must be true or false", field="enabled")
    fields = {"enabled": enabled}
    if enabled and not schedule.enabled:
        fields["next_run_at"] = _times(schedule).next_start(timezone.now())
    ChaosSchedule.objects.filter(pk=schedule.pk).update(**fields)
    schedule.refresh_from_db()
    return schedule


def schedule_delete(*, schedule: ChaosSchedule, actor) -> None:
    """Delete a schedule; a run it started goes on (abort it on its own)."""
    as_actor(actor)
    ChaosSchedule.objects.filter(pk=schedule.pk).delete()


def _outcome(schedule: ChaosSchedule, due: datetime, text: str, run=None) -> None:
    ChaosSchedule.objects.filter(pk=schedule.pk).update(last_fired_at=due, last_outcome=text,
                                                        **({"last_run": run} if run is not None else {}))


def schedule_fire(schedule: ChaosSchedule, *, now: datetime) -> str:
    """One due schedule (steps 1-3 of the module docstring). Returns what it did."""
    due = schedule.next_run_at
    following = _times(schedule).next_start(now)
    if ChaosSchedule.objects.filter(pk=schedule.pk, enabled=True, next_run_at=due).update(
            next_run_at=following) != 1:
        return "taken by another driver"
    if (now - due).total_seconds() > MISSED_GRACE_S:
        _outcome(schedule, due, f"missed: found {now - due} late")
        return "missed"
    if not _allowed(schedule, due):
        _outcome(schedule, due, "outside its window")
        return "outside its window"
    experiment = schedule.experiment
    reason = f"chaos schedule {schedule.pk} ({schedule.cron} {schedule.tz})"
    try:
        run = run_start(experiment=experiment, actor=SCHEDULER, reason=reason)
    except ControlPlaneError as error:
        with transaction.atomic():
            action_create(kind=ActionKind.START, actor=SCHEDULER, deployment=experiment.deployment,
                          reason=f"{reason}: refused: {error.message}", status=ActionStatus.FAILED,
                          params={"event": "chaos_schedule_refused", "chaos_schedule": schedule.pk,
                                  "experiment": experiment.name, "code": error.code})
            _outcome(schedule, due, f"refused: {error.message}")
        return f"refused: {error.code}"
    _outcome(schedule, due, f"started run {run.pk}", run=run)
    return f"started run {run.pk}"


def schedules_start_due(*, now: float) -> dict:
    """Fire every enabled schedule whose time has come; one that fails does not stop the others."""
    moment = datetime.fromtimestamp(now, tz=dt_timezone.utc)
    done = {}
    due = ChaosSchedule.objects.filter(enabled=True, next_run_at__lte=moment).select_related(
        "experiment", "experiment__deployment")
    for schedule in due:
        try:
            done[schedule.pk] = schedule_fire(schedule, now=moment)
        except Exception:
            log.exception("firing chaos schedule %s failed", schedule.pk)
            done[schedule.pk] = "error"
    return done


def next_times(schedule: ChaosSchedule, count: int = 3) -> list[datetime]:
    """The schedule's next `count` cron times inside its window (for the API and the page)."""
    times, at = [], max(schedule.next_run_at - timedelta(seconds=1), timezone.now())
    window = _times(schedule)
    for _ in range(200):  # a window that rarely meets the cron: look this far, no further
        at = window.next_start(at)
        if _allowed(schedule, at):
            times.append(at)
            if len(times) == count:
                break
    return times
