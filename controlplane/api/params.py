"""Query parameters that the API views of several apps read alike: a point in time (`start`, `end`)."""
from __future__ import annotations

import math
import re
from datetime import timezone as dt_timezone

from django.utils.dateparse import parse_datetime

from controlplane.errors import invalid

MAX_UNIX_S = 253402300799.0  # 9999-12-31T23:59:59Z
_OFFSET_AS_SPACE = re.compile(r"(:\d{2}(?:\.\d+)?) (\d{2}:?\d{2})$")  # seconds, then the offset


def parse_time(raw: str, name: str) -> float:
    """Unix seconds or an ISO 8601 date-time with a zone (a naive one is taken as UTC)."""
    try:
        value = float(raw)
    except ValueError:
        # An unencoded '+' of a zone offset arrives as a space: "…T12:00:00 02:00" means "…T12:00:00+02:00".
        try:
            parsed = parse_datetime(_OFFSET_AS_SPACE.sub(r"\1+\2", raw.strip()))
        except ValueError:  # well formed but not a real date-time: month 13, hour 25, a 30 February...
            parsed = None
        if parsed is None:
            raise invalid(f"{name}={raw!r} is neither Unix seconds nor an ISO 8601 date-time "
                          f"(e.g. 2026-01-31T12:00:00Z)", field=name) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt_timezone.utc)
        value = parsed.timestamp()
    # The same bounds both ways: before 1970 nothing was stored, and a number past year 9999 is a typo that would
    # only fill the messages below with hundreds of digits.
    if not math.isfinite(value) or not 0 <= value <= MAX_UNIX_S:
        raise invalid(f"{name}={raw!r} must be between 1970 and year 9999 (Unix seconds 0..{MAX_UNIX_S:.0f})",
                      field=name)
    return value
