"""What the gateway measures of one served request, on the client's side of the wire: time to first token, inter-token
latency and end-to-end latency into the serving revision's series (TTFT into the tenant's too), and each streamed
token charged to the tenant's virtual token counter (admission.py)."""
from __future__ import annotations

import time

from inference.gateway.tenancy import Ticket
from inference.gateway.token_stream import TokenStream
from inference.gateway.trace_log import TraceEntry
from inference.metrics import RequestSeries


class Served:
    """One request from its first token on: the revision's series it is measured into, its response headers, and its
    client-side clock (arrival, the last token, the deadline)."""

    __slots__ = ("series", "headers", "received", "deadline", "ticket", "trace", "_last")

    def __init__(self, series: RequestSeries, headers: dict[str, str], received: float, deadline: float,
                 ticket: Ticket, trace: TraceEntry | None = None) -> None:
        self.series, self.headers, self.received, self.deadline = series, headers, received, deadline
        self.ticket, self.trace = ticket, trace
        self._last: float | None = None
        if trace is not None:
            trace.revision = headers.get("X-Tandem-Revision")

    def observe_token(self, num_tokens: int) -> None:
        """TTFT for the first token, inter-token latency for the others; the tokens count on the tenant's virtual
        token counter as they are served (admission.py)."""
        self.ticket.slot.charge(completion_tokens=num_tokens)
        now = time.perf_counter()
        if self._last is None:
            self.series.time_to_first_token.observe(now - self.received)
            self.ticket.observe_ttft(now - self.received)
            if self.trace is not None:
                self.trace.first(now)
        else:
            self.series.inter_token_latency.observe(now - self._last)
        self._last = now

    def observe_finish(self, stream: TokenStream) -> None:
        finish = stream.finish
        self.series.e2e_request_latency.observe(time.perf_counter() - self.received)
        self.series.prompt_tokens.inc(finish.prompt_tokens)
        self.series.generation_tokens.inc(finish.completion_tokens)
        self.series.count_success(finish.reason or "unknown")
        if self.trace is not None:
            self.trace.finished(finish.prompt_tokens, finish.completion_tokens, finish.reason)
