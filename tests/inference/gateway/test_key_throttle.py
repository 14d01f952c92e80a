"""Wrong API keys per client address, on a hand-driven clock: past the limit in a minute an address gets 429 with a
Retry-After that is right, whatever key it sends, until its minute is over; other addresses are not touched; the
addresses tracked stay bounded."""
from __future__ import annotations

import pytest

from inference.gateway.key_throttle import KeyThrottle
from inference.gateway.openai_protocol import ApiError


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_address_past_the_limit_waits_out_its_minute_and_others_do_not():
    clock = Clock()
    throttle = KeyThrottle(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        throttle.check("10.0.0.1")
        throttle.failed("10.0.0.1")
    clock.now += 15
    with pytest.raises(ApiError) as refused:
        throttle.check("10.0.0.1")
    assert refused.value.status == 429 and refused.value.code == "too_many_wrong_keys"
    assert refused.value.headers["Retry-After"] == "45"
    throttle.check("10.0.0.2")  # another address: untouched
    throttle.check(None)  # no address known (a Unix socket): never throttled
    clock.now += 45
    throttle.check("10.0.0.1")  # its minute is over


def test_the_addresses_tracked_stay_bounded():
    throttle = KeyThrottle(limit=1, max_addresses=100, clock=Clock())
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle._failures) == 100
    with pytest.raises(ApiError):
        throttle.check("10.0.3.231")  # the newest are kept
