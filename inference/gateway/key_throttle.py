"""A throttle on wrong API keys, per client address: past LIMIT wrong keys in a minute, an address gets 429 for
the rest of that minute, whatever key it sends, before any key is looked at.

Keys carry 240 random bits, so guessing is hopeless anyway; the throttle costs a client with a valid key nothing and
a guesser every attempt it would have made (a probe made 716 a second). By the connection's address, never
X-Forwarded-For, which any client writes. Memory stays bounded: at most MAX_ADDRESSES are tracked, the oldest
dropped first.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from inference.gateway.openai_protocol import ApiError

LIMIT = 20  # wrong keys an address may send in WINDOW_S
WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


class KeyThrottle:
    def __init__(self, *, limit: int = LIMIT, window_s: float = WINDOW_S, max_addresses: int = MAX_ADDRESSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self.max_addresses, self.clock = limit, window_s, max_addresses, clock
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()  # address -> (window start, count)

    def check(self, address: str | None) -> None:
        """429 while `address` is over the limit in its current window."""
        if address is None:
            return
        entry = self._failures.get(address)
        if entry is None:
            return
        started, count = entry
        left = started + self.window_s - self.clock()
        if left <= 0:
            del self._failures[address]
        elif count >= self.limit:
            retry_after = max(1, math.ceil(left))
            raise ApiError(429, f"too many wrong API keys from this address ({count} in {self.window_s:g} s); "
                                f"retry after {retry_after} s", type="rate_limit_error", code="too_many_wrong_keys",
                           headers={"Retry-After": str(retry_after)})

    def failed(self, address: str | None) -> None:
        """One more wrong key from `address`."""
        if address is None:
            return
        now = self.clock()
        started, count = self._failures.pop(address, (now, 0))
        if now - started >= self.window_s:
            started, count = now, 0
        self._failures[address] = (started, count + 1)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
