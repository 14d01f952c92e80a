"""A request's tokens after its first one, relayed to the client, and moved to another worker when its worker dies.

A request runs in legs. Its first leg is the worker (pair) `Relay.start` found; when the worker streaming it goes away
mid-stream (the connection drops, the stream ends without `done`, a line is cut, the worker drains away), the stream
asks `resume` for a new leg on another ready worker (pair) of the same revision, sending the prompt again with every
token relayed so far (`resume_token_ids`, docs/contracts.md). The new worker prefills prompt + those tokens, replays
them through its detokenizer and goes on from there: the client sees a pause, not an error, and no character is
repeated or lost at the seam. Greedy requests continue token-identically (the same prefix gives the same argmax);
a sampled request (temperature > 0) continues with fresh draws for its remaining tokens, so only greedy output is
the same as an uninterrupted run's. A request moves at most --max-migrations times.

A hung worker (stopped, wedged, its host frozen) closes nothing: its streams would wait until something kills it.
So a leg also moves on as soon as the gateway takes its streaming worker out of rotation (its health probes failed,
Worker.ejected): with the default probes (every 1 s, 1 s timeout, 2 in a row) a stalled stream resumes within a few
seconds.

The gateway may also preempt a stream (preemption.py): when `preempt_requested` is set, the leg is closed the same way,
`pause` gives its admission slot away and waits for another, and the request resumes on any ready worker, as a
migration does; a preemption is no migration (it neither counts against --max-migrations nor avoids the worker).

Failures that may belong to the request rather than to the worker (an engine error, a timeout, a refusal) end the
stream as before: moving them could carry the failure to the next worker.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

log = logging.getLogger("tandem.gateway.relay")

TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# Error events that mean "this worker is going away", not "this request failed": the request may move.
WORKER_GONE_KINDS = frozenset({"drain"})
PREEMPTED = "preempted"  # the gateway asked the stream to step aside (preemption.py)


class StreamBroken(Exception):
    """The request failed after its first token was sent. `migratable`: its worker went away, another may go on."""

    def __init__(self, kind: str, message: str, *, migratable: bool = False) -> None:
        super().__init__(message)
        self.kind, self.message, self.migratable = kind, message, migratable


@dataclass(slots=True)
class Finish:
    reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True, eq=False)
class Leg:
    """One worker (pair)'s part of a request: the tokens already in hand, then its worker stream.

    `close` releases the workers' outstanding counts and the upstream connections: a finished leg's connection goes
    back to the pool (keep-alive); an unfinished one is closed, which tells the worker that nobody listens any more
    (it aborts the request and frees its KV blocks).
    """

    prompt_tokens: int
    pending: list[tuple[str, list[int]]]  # (text, token ids) per token event already read
    finish: Finish | None = None
    upstream: AsyncIterator[dict] | None = None
    releases: list[Callable[[], None]] = field(default_factory=list)
    responses: list[aiohttp.ClientResponse] = field(default_factory=list)
    streamed_by: str = ""  # the worker whose stream this is: excluded when the request moves on
    on_disconnect: Callable[[str], None] | None = None  # the worker dropped the connection: out of rotation
    ejected: asyncio.Event | None = None  # set when the streaming worker leaves the rotation: the leg moves on

    async def close(self) -> None:
        releases, self.releases = self.releases, []
        for release in releases:
            release()
        if self.upstream is not None:
            upstream, self.upstream = self.upstream, None
            await upstream.aclose()
        responses, self.responses = self.responses, []
        for resp in responses:
            if self.finish is not None:
                resp.release()
            else:
                resp.close()


# resume(token ids relayed so far, workers to avoid, migration number) -> the next leg, or StreamBroken
Resume = Callable[[list[int], set[str], int], Awaitable[Leg]]


class TokenStream:
    def __init__(self, leg: Leg, *, resume: Resume | None = None, max_migrations: int = 0,
                 on_migration: Callable[[str], None] | None = None) -> None:
        self._leg = leg
        self._resume = resume
        self.max_migrations = max_migrations
        self._on_migration = on_migration or (lambda reason: None)
        self.token_ids: list[int] = []  # every token relayed to the client, over all legs
        self.num_migrations = 0
        self.num_preemptions = 0
        self._avoid: set[str] = set()
        # Set by preemption.Preemption.start: the event that asks this stream to step aside, and what it awaits then.
        self.preempt_requested: asyncio.Event | None = None
        self.pause: Callable[[], Awaitable[None]] | None = None
        self.handed_over: Callable[[], Awaitable[None]] | None = None  # until the waiter reached its worker

    @property
    def prompt_tokens(self) -> int:
        return self._leg.prompt_tokens

    @property
    def finish(self) -> Finish | None:
        return self._leg.finish

    async def deltas(self) -> AsyncIterator[tuple[str, int]]:
        """(text delta, number of tokens) per token event. The text may be empty while a multi-byte character is
        incomplete; the number is 0 for text a worker releases at the finish with no token of its own.
        Raises StreamBroken when the request fails and cannot (or may no more) move to another worker."""
        while True:
            try:
                async for text, token_ids in self._leg_deltas(self._leg):
                    self.token_ids.extend(token_ids)
                    yield text, len(token_ids)
                return
            except StreamBroken as broken:
                if broken.kind == PREEMPTED:
                    await self._preempt()
                    continue
                if not broken.migratable or self._resume is None or self.num_migrations >= self.max_migrations:
                    raise
                await self._migrate(broken)

    async def _migrate(self, broken: StreamBroken) -> None:
        log.warning("moving a request to another worker after %d tokens (%s): %s", len(self.token_ids),
                    broken.kind, broken.message)
        self._avoid.add(self._leg.streamed_by)
        await self._leg.close()
        try:
            self._leg = await self._resume(list(self.token_ids), set(self._avoid), self.num_migrations + 1)
        except StreamBroken as failed:
            raise StreamBroken(broken.kind, f"{broken.message}; no other worker could continue it: "
                                            f"{failed.message}") from None
        self.num_migrations += 1
        self._on_migration(broken.kind)

    async def _preempt(self) -> None:
        if self.handed_over is not None:
            await self.handed_over()  # so that the sequence freed below goes to it, not to one waiting there before
        await self._leg.close()  # the worker aborts the request and frees its sequence
        await self.pause()
        number = self.num_migrations + self.num_preemptions + 1
        self.num_preemptions += 1
        try:
            self._leg = await self._resume(list(self.token_ids), set(self._avoid), number)
        except StreamBroken as failed:
            raise StreamBroken(failed.kind, f"the request could not resume after it was preempted: "
                                            f"{failed.message}") from None

    async def _leg_deltas(self, leg: Leg) -> AsyncIterator[tuple[str, list[int]]]:
        pending, leg.pending = leg.pending, []
        for item in pending:
            yield item
        if leg.finish is not None or leg.upstream is None:
            return
        try:
            async for event in self._events(leg):
                kind = event.get("type")
                if kind == "token":
                    yield event.get("text") or "", list(event.get("token_ids") or ())
                elif kind == "done":
                    # The worker that finished counts every generated token: the prefill's first one, and those of
                    # earlier legs (it was sent them).
                    completion_tokens = event.get("completion_tokens")
                    if not isinstance(completion_tokens, int):
                        completion_tokens = len(self.token_ids)
                    leg.finish = Finish(event.get("finish_reason"), leg.prompt_tokens, completion_tokens)
                    return
                elif kind == "error":
                    kind = str(event.get("kind") or "worker")
                    raise StreamBroken(kind, str(event.get("message")), migratable=kind in WORKER_GONE_KINDS)
        except TRANSPORT_ERRORS as exc:
            reason = f"the worker stream broke: {type(exc).__name__}: {exc}"
            if leg.on_disconnect is not None:
                leg.on_disconnect(reason)
            raise StreamBroken("worker_disconnected", reason, migratable=True) from None
        except ValueError as exc:
            raise StreamBroken("bad_worker_answer", f"the worker sent a line that is not JSON: {exc}",
                               migratable=True) from None
        raise StreamBroken("worker_disconnected", "the worker closed the stream before it finished", migratable=True)

    async def _events(self, leg: Leg) -> AsyncIterator[dict]:
        """The leg's worker events, until the gateway takes that worker out of rotation (StreamBroken, migratable) or
        preempts the stream (StreamBroken PREEMPTED). One wait per event on the next line and on those two events: a
        hung worker sends neither a line nor an EOF."""
        stops = {event: kind for event, kind in ((leg.ejected, "worker_ejected"),
                                                 (self.preempt_requested, PREEMPTED)) if event is not None}
        if not stops:
            async for event in leg.upstream:
                yield event
            return
        upstream = leg.upstream.__aiter__()
        waits = {asyncio.ensure_future(event.wait()): kind for event, kind in stops.items()}
        step = None
        try:
            while True:
                step = asyncio.ensure_future(upstream.__anext__())
                await asyncio.wait((step, *waits), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    kind = next(kind for wait, kind in waits.items() if wait.done())
                    if kind == PREEMPTED:
                        raise StreamBroken(PREEMPTED, "the gateway preempted the request")
                    raise StreamBroken("worker_ejected", f"{leg.streamed_by} was taken out of rotation mid-stream",
                                       migratable=True)
                try:
                    event = step.result()
                except StopAsyncIteration:
                    return
                yield event
        finally:
            for wait in waits:
                wait.cancel()
            if step is not None and not step.done():
                # Cancelled while waiting (the request's deadline, say): stop the read before anyone closes the
                # upstream, which cannot be closed while a read of it runs.
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)

    def release_workers(self) -> None:
        """Take the request out of its workers' outstanding counts now, ahead of `close` (a preemption hands its place
        to the waiter at once; the worker frees the sequence when the leg closes, a moment later)."""
        releases, self._leg.releases = self._leg.releases, []
        for release in releases:
            release()

    async def close(self) -> None:
        await self._leg.close()
