"""One open request on the asyncio side: the mailbox the engine thread writes events into, and its NDJSON stream.

Waiting for the next event never waits blindly: every JOB_POLL_S the job asks `health` (the server's view of the
engine loop) and turns a dead or stuck loop into an error event, so no handler hangs on a loop that will never answer.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from aiohttp import web

from inference import ndjson
from inference.metrics import TandemMetrics
from inference.worker.engine_request import Event
from inference.worker.protocol import RequestError

log = logging.getLogger(__name__)

JOB_POLL_S = 1.0


class Job:
    def __init__(self, request_id: str, arrival: float, *, health: Callable[[], tuple[str, str]],
                 metrics: TandemMetrics):
        self.request_id = request_id
        self.arrival = arrival
        self.health = health  # () -> (status, reason), as /health reports it
        self.metrics = metrics
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.submitted = False  # handed to the engine thread (so closing it early must abort it there)
        self.finished = False  # the engine is done with it (done, error, rejected, or a prefill handoff)
        self.accepted = False  # decode role: admitted by the engine, so it may be streamed
        self.claimed = False  # decode role: someone streams it
        self.num_prompt_tokens = 0
        self._claim_timer: asyncio.TimerHandle | None = None
        self._on_unclaimed: Callable[[], None] | None = None

    def emit(self, event: Event) -> None:
        """Called by the engine: on its own thread (a real engine), or on the event loop (the simulated one)."""
        if threading.get_ident() == self._loop_thread:
            self.events.put_nowait(event)
            return
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop closed during shutdown; nobody is left to read this
            pass

    def fail(self, message: str, *, kind: str) -> None:
        """Fail from the asyncio side (drain timeout, stream not claimed)."""
        self.events.put_nowait(Event("error", message=message, kind=kind))

    async def next_event(self) -> Event:
        while True:
            try:
                event = await asyncio.wait_for(self.events.get(), JOB_POLL_S)
            except TimeoutError:
                status, reason = self.health()
                if status in ("ok", "draining"):
                    continue
                event = Event("error", message=f"the engine stopped answering ({status}: {reason})", kind="engine")
                self.metrics.count_error("engine")
            if event.type in ("done", "error", "rejected") or (event.type == "token" and (
                    event.kv is not None or event.finish_reason is not None)):
                self.finished = True
            return event

    async def wait_admitted(self) -> None:
        """Return once the engine admitted the submission; raise 400 if it rejected it, 503 if it failed."""
        event = await self.next_event()
        if event.type == "admitted":
            self.num_prompt_tokens = event.num_prompt_tokens
            return
        if event.type == "rejected":
            raise RequestError(event.message)
        raise RequestError(event.message, status=503, type="engine_error", code=event.kind or "engine",
                           kind=event.kind or "engine", counted=True)

    # -- decode role: a received request waits for its stream ------------------------------------------------------

    def start_claim_timer(self, timeout: float, on_unclaimed: Callable[[], None]) -> None:
        """Call `on_unclaimed` (it aborts the request) unless someone claims the stream within `timeout`."""
        self._on_unclaimed = on_unclaimed
        self._claim_timer = self.loop.call_later(timeout, self._unclaimed)

    def cancel_claim_timer(self) -> None:
        if self._claim_timer is not None:
            self._claim_timer.cancel()
            self._claim_timer = None

    def _unclaimed(self) -> None:
        if self.claimed:
            return
        log.warning("%s: nobody streamed it within the claim timeout; aborting", self.request_id)
        self._on_unclaimed()


async def stream_job(request: web.Request, job: Job) -> web.StreamResponse:
    """Answer with the job's events as NDJSON: "start", then tokens, until "done" or "error"."""
    response = web.StreamResponse(headers={"Content-Type": ndjson.CONTENT_TYPE, "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(ndjson.encode({"type": "start", "request_id": job.request_id,
                                        "prompt_tokens": job.num_prompt_tokens}))
    await _write_events(response, job)
    await response.write_eof()
    return response


async def _write_events(response: web.StreamResponse, job: Job) -> None:
    while True:
        event = await job.next_event()
        if event.type == "token":
            await response.write(ndjson.encode({"type": "token", "token_ids": event.token_ids, "text": event.text}))
            continue
        if event.type == "done":
            if event.text:  # held-back text released at the finish, with no token of its own
                await response.write(ndjson.encode({"type": "token", "token_ids": [], "text": event.text}))
            await response.write(ndjson.encode({"type": "done", "finish_reason": event.finish_reason,
                                                "prompt_tokens": job.num_prompt_tokens or event.num_prompt_tokens,
                                                "completion_tokens": event.num_completion_tokens}))
            return
        message = event.message or "the request failed"
        await response.write(ndjson.encode({"type": "error", "message": message, "kind": event.kind or "engine"}))
        return
