"""Schedule windows in wall-clock time of their zone: boundaries, other zones, and both DST changes."""
from datetime import datetime, timezone

import pytest

from controlplane.capacity.sizing.windows import Window, WindowError


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


WEEKDAYS_PARIS = Window("0 9 * * 1-5", 540, "Europe/Paris")  # 09:00-18:00 Paris, Monday to Friday


@pytest.mark.parametrize("at, active", [
    ("2026-11-30T07:59:59", False),  # Monday 08:59:59 in Paris (UTC+1)
    ("2026-11-30T08:00:00", True),
    ("2026-11-30T16:59:59", True),
    ("2026-11-30T17:00:00", False),  # 18:00 Paris: the end is exclusive
    ("2026-12-05T10:00:00", False),  # Saturday
])
def test_a_weekday_window_in_paris_winter_time(at, active):
    assert WEEKDAYS_PARIS.is_active(utc(at)) is active


def test_the_same_window_follows_paris_summer_time():
    assert WEEKDAYS_PARIS.is_active(utc("2026-07-06T07:00:00"))  # 09:00 CEST = 07:00 UTC
    assert not WEEKDAYS_PARIS.is_active(utc("2026-07-06T16:00:00"))  # 18:00 CEST


def test_a_new_york_window_is_not_a_utc_window():
    evening = Window("0 18 * * *", 120, "America/New_York")
    assert evening.is_active(utc("2026-11-30T23:30:00"))  # 18:30 EST
    assert not evening.is_active(utc("2026-11-30T18:30:00"))  # 18:30 UTC is 13:30 in New York


def test_a_window_across_the_spring_forward_night_keeps_wall_clock_hours():
    # Europe/Paris, 29 March 2026: 02:00 → 03:00. 01:00-05:00 wall clock is 3 real hours that night.
    night = Window("0 1 * * *", 240, "Europe/Paris")
    assert night.is_active(utc("2026-03-29T00:00:00"))  # 01:00 CET
    assert night.is_active(utc("2026-03-29T02:59:00"))  # 04:59 CEST
    assert not night.is_active(utc("2026-03-29T03:00:00"))  # 05:00 CEST
    assert night.active_until(utc("2026-03-29T01:30:00")) == utc("2026-03-29T03:00:00")


def test_a_start_inside_the_skipped_hour_opens_at_the_jump():
    skipped = Window("30 2 * * *", 60, "Europe/Paris")  # 02:30 does not exist on 29 March
    assert not skipped.is_active(utc("2026-03-29T00:59:00"))  # 01:59 CET
    assert skipped.is_active(utc("2026-03-29T01:00:00"))  # 03:00 CEST, inside 02:30-03:30 wall clock
    assert not skipped.is_active(utc("2026-03-29T01:30:00"))  # 03:30 CEST


def test_a_window_across_the_fall_back_night_lasts_an_hour_longer():
    # 25 October 2026: 03:00 CEST → 02:00 CET. 00:00-06:00 wall clock is 7 real hours.
    night = Window("0 0 * * *", 360, "Europe/Paris")
    opened, closed = utc("2026-10-24T22:00:00"), night.active_until(utc("2026-10-25T01:00:00"))
    assert closed == utc("2026-10-25T05:00:00") and (closed - opened).total_seconds() == 7 * 3600
    assert night.is_active(utc("2026-10-25T04:59:00")) and not night.is_active(utc("2026-10-25T05:00:00"))


def test_the_next_start_is_in_utc():
    assert WEEKDAYS_PARIS.next_start(utc("2026-12-04T20:00:00")) == utc("2026-12-07T08:00:00")  # Friday → Monday


@pytest.mark.parametrize("args, field", [
    (("0 9 * *", 60, "UTC"), "cron"),
    (("61 9 * * *", 60, "UTC"), "cron"),
    (("0 9 * * *", 0, "UTC"), "duration_minutes"),
    (("0 9 * * *", 60, "Mars/Olympus"), "timezone"),
])
def test_bad_windows_name_the_field(args, field):
    with pytest.raises(WindowError) as err:
        Window(*args)
    assert err.value.field == field
