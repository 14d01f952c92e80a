"""Schedule windows: a cron expression that starts a window, its length, and a time zone. Pure (croniter, zoneinfo).

Times are wall-clock in the window's zone: "0 9 * * 1-5" for 540 minutes is 09:00-18:00 local on weekdays, on DST
change days too (the window then lasts 8 or 10 real hours). A start that falls in a spring-forward gap (02:30 on the
night clocks jump from 02:00 to 03:00) opens the window at the first valid instant after it; in the repeated hour of
a fall-back night the wall clock is compared, so that hour is inside or outside the window both times.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

MAX_DURATION_MIN = 7 * 24 * 60


class WindowError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Window:
    cron: str
    duration_min: int
    tz: str = "UTC"

    def __post_init__(self) -> None:
        fields = self.cron.split()
        if len(fields) != 5 or not croniter.is_valid(self.cron):
            raise WindowError("cron", f"not a 5-field cron expression (minute hour day month weekday): {self.cron!r}")
        if isinstance(self.duration_min, bool) or not isinstance(self.duration_min, int) or \
                not 1 <= self.duration_min <= MAX_DURATION_MIN:
            raise WindowError("duration_minutes", f"must be an integer 1..{MAX_DURATION_MIN}, not {self.duration_min!r}")
        zone_of(self.tz)

    def last_start(self, at: datetime) -> datetime:
        """The most recent start at or before `at`, as a naive wall-clock time in the window's zone."""
        # get_prev is strict: start from the next whole minute so that a start at `at`'s own minute counts.
        base = _wall(at, self.tz).replace(second=0, microsecond=0) + timedelta(minutes=1)
        return croniter(self.cron, base).get_prev(datetime)

    def is_active(self, at: datetime) -> bool:
        start = self.last_start(at)
        return start <= _wall(at, self.tz) < start + timedelta(minutes=self.duration_min)

    def next_start(self, at: datetime) -> datetime:
        """The next start after `at`, as an aware UTC datetime."""
        local = croniter(self.cron, _wall(at, self.tz)).get_next(datetime)
        return _aware(local, self.tz)

    def active_until(self, at: datetime) -> datetime | None:
        """When the window that contains `at` ends (aware UTC), or None when it is not active."""
        if not self.is_active(at):
            return None
        return _aware(self.last_start(at) + timedelta(minutes=self.duration_min), self.tz)


def zone_of(name: str) -> ZoneInfo:
    if not isinstance(name, str) or name not in _zones():
        raise WindowError("timezone", f"unknown time zone {name!r} (an IANA name, e.g. Europe/Paris or UTC)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise WindowError("timezone", f"unknown time zone {name!r}") from exc


_ZONES: set[str] | None = None


def _zones() -> set[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = available_timezones() | {"UTC"}
    return _ZONES


def _wall(at: datetime, tz: str) -> datetime:
    if at.tzinfo is None:
        raise ValueError("an aware datetime is needed")
    return at.astimezone(ZoneInfo(tz)).replace(tzinfo=None)


def _aware(wall: datetime, tz: str) -> datetime:
    """A wall-clock time in `tz` as aware UTC. In a gap (a time that does not exist) fold=0 gives the instant just
    after the jump, which is where the window opens."""
    return wall.replace(tzinfo=ZoneInfo(tz)).astimezone(timezone.utc)
