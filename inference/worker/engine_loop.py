"""The thread that owns the engine: it loads the model, steps, detokenizes, and hands events to asyncio.

The engine is not thread-safe, and its steps are long blocking torch calls, so exactly one thread touches it. The
HTTP side talks to that thread through a queue of commands (`submit`, `abort`); the thread answers each request
through its `emit` callback, which the server builds on `loop.call_soon_threadsafe`, so no asyncio object is ever
touched from this thread.

Liveness: the loop stamps `heartbeat` on every iteration; when idle it blocks on its command queue for at most
IDLE_WAIT_S, so the stamp stays fresh on an idle worker too. A step that raises fails the requests of the engine (the
engine may be half-way through them) and the loop goes on; MAX_CONSECUTIVE_STEP_FAILURES in a row mean the engine
is broken, and the thread dies: `/health` reports dead, and every request still open gets an error event.

A resumed request (docs/contracts.md, `resume_token_ids`: the gateway continues a request whose worker died) carries
the tokens generated before after its prompt. They are replayed through the detokenizer, so that it releases exactly
the text the client has not received yet, and count against max_tokens and as completion tokens; a replay that
already ends the request (a stop string, EOS, max_tokens) finishes it without the engine.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from inference.engine.sequence import STANDARD_PRIORITY
from inference.metrics import TandemMetrics
from inference.roles import Role
from inference.sampling_params import SamplingParams
from inference.worker.detokenize import IncrementalDetokenizer, TextDecoder

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.1
MAX_CONSECUTIVE_STEP_FAILURES = 3


class LoopState(Enum):
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"
    STOPPED = "stopped"


@dataclass(slots=True)
class Event:
    """One message from the engine thread to a request's handler."""

    type: str  # "admitted" | "rejected" | "token" | "done" | "error"
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # on "done" (and on a prefill "token" that already finishes the request)
    message: str = ""  # on "rejected" and "error"
    kind: str = ""  # on "error": engine | timeout | ...
    # Prefill role, with the first token: (k, v) [num_layers, num_prompt_tokens, Hkv, D]; () from the simulated engine.
    kv: tuple | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request on the engine's side, from its submission to its last event: what the handler asked for, then
    the engine's bookkeeping of it (the real engine loop's, or the simulated engine's)."""

    request_id: str
    prompt_token_ids: list[int]  # the prompt, then the num_resumed_tokens generated before (a resumed request)
    params: SamplingParams  # max_tokens: the whole request's, resumed tokens included
    stop: list[str]
    emit: Callable[[Event], None]  # thread-safe
    arrival: float  # time.monotonic() when the HTTP request arrived
    first_token_id: int | None = None  # decode role: the prefill worker's first token, with its K/V
    kv: tuple | None = None
    num_resumed_tokens: int = 0
    cache_salt: bytes = b""  # its tenant's prefix-cache salt (inference/engine/prefix_cache.py)
    priority: int = STANDARD_PRIORITY  # its band in the waiting queue (inference.engine.sequence.PRIORITY_BANDS)
    itl_target_s: float | None = None  # its deployment's ITL objective (inference/engine/batch_limit.py)
    # From admission on: its text, the tokens it generated (resumed ones included) and when the last one came.
    detok: TextDecoder | None = None
    num_completion_tokens: int = 0
    last_token_at: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """The client's prompt: what usage reports, whatever was resumed."""
        return len(self.prompt_token_ids) - self.num_resumed_tokens


class EngineLoop:
    def __init__(self, make_engine: Callable[[], object], metrics: TandemMetrics, *, role: Role):
        self.make_engine = make_engine
        self.metrics = metrics
        self.role = role
        self.state = LoopState.STARTING
        self.reason = "loading the model"
        self.heartbeat = time.monotonic()
        self.engine = None
        self.stats: dict = {}
        self.loaded = threading.Event()  # set once loading ended, either way
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._open: dict[str, EngineRequest] = {}
        self._stop = threading.Event()
        self._num_prefill_tokens_seen = 0
        self._interleaves = False  # the engine prefills arrivals between a step's layers (_between)
        self._between_s = 0.0  # of the step under way: seconds spent in _between
        # inference.roofline.StageRoofline, set on this thread once the model is loaded (ModelEngine) where the host's
        # figures are known: each step's time is counted against them.
        self.roofline = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # -- called from the asyncio thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def submit(self, request: EngineRequest) -> None:
        self._commands.put(("submit", request))
        self._raise_arrivals()

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._raise_arrivals()  # an abort may free the place a waiting request takes between the layers

    def _raise_arrivals(self) -> None:
        """After the command is queued: a step under way pauses at its next layer and takes it
        (inference/engine/interleave.py), where the engine does that."""
        arrivals = getattr(self.engine, "arrivals", None)
        if arrivals is not None:
            arrivals.raise_()

    def seconds_since_heartbeat(self) -> float:
        return time.monotonic() - self.heartbeat

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- the engine thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine = self.make_engine()
        except BaseException as exc:  # a bad folder, out of memory...: the process cannot serve
            log.exception("loading the model failed")
            self.state, self.reason = LoopState.DEAD, f"loading the model failed: {exc}"
            self.loaded.set()
            return
        self._publish_stats()
        self.state, self.reason = LoopState.READY, ""
        self.loaded.set()
        try:
            self._loop()
            self.state, self.reason = LoopState.STOPPED, "stopped"
        except BaseException as exc:
            log.exception("the engine loop died")
            self.state, self.reason = LoopState.DEAD, f"engine loop died: {exc!r}"
        finally:
            self._fail_all("engine", f"the engine loop stopped: {self.reason}", abort=False)

    def _loop(self) -> None:
        engine = self.engine
        num_failures = 0
        self._interleaves = getattr(engine, "interleave_prefill", False)  # the simulated engine does not
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            if self._interleaves:
                engine.arrivals.lower()  # what is queued now is taken below; what comes later raises it again
            self._apply_commands(block=not engine.has_unfinished())
            if not engine.has_unfinished():
                continue
            try:
                started = time.perf_counter()
                self._between_s = 0.0
                outputs = engine.step(self._between) if self._interleaves else engine.step()
                step_s = time.perf_counter() - started - self._between_s
                num_failures = 0
                if engine.num_step_tokens:
                    self.metrics.batch_tokens_per_step.observe(engine.num_step_tokens)
            except Exception as exc:
                num_failures += 1
                log.exception("engine step failed (%d in a row)", num_failures)
                self._fail_all("engine", f"engine step failed: {exc}", abort=True)
                if num_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                    raise
                continue
            # Stats first: a client that sees a token and then scrapes /metrics sees this step counted.
            self._publish_stats(step_s=step_s)
            self._deliver_all(outputs)

    def _between(self) -> None:
        """A step paused between layers (its arrivals flag raised): take the new commands, prefill what can
        start now, and send those first tokens at once; the step then goes on. The prefill counts as a step of its
        own (stats, roofline, batch size), and its time is left out of the paused step's."""
        started, nested_before = time.perf_counter(), self._between_s
        self._apply_commands(block=False)
        outputs = self.engine.prefill_between()  # may pause in turn: a nested call of this, timed by itself
        elapsed = time.perf_counter() - started
        if outputs or self.engine.num_step_tokens:
            step_s = elapsed - (self._between_s - nested_before)
            self.metrics.batch_tokens_per_step.observe(self.engine.num_step_tokens)
            self._publish_stats(step_s=step_s)
            self._deliver_all(outputs)
        self._between_s = nested_before + elapsed

    def _apply_commands(self, *, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = command
            if kind == "submit":
                self._admit(arg)
            elif kind == "abort":
                if self._open.pop(arg, None) is not None:
                    self.engine.abort(arg)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _admit(self, req: EngineRequest) -> None:
        """Hand a request to the engine; the engine's ValueError (it checks the request too) rejects it alone."""
        engine = self.engine
        try:
            if req.request_id in self._open:
                raise ValueError(f"request_id {req.request_id!r} is already running on this worker")
            detok = IncrementalDetokenizer(engine.tokenizer, req.prompt_token_ids[:req.num_prompt_tokens], req.stop)
            finish_reason = self._replay(detok, req)
            if finish_reason is not None:
                self._finish_replayed(req, detok, finish_reason)
                return
            # The engine's prompt holds the resumed tokens; its budget is what is left of the request's.
            params = replace(req.params, max_tokens=req.params.max_tokens - req.num_resumed_tokens)
            if req.first_token_id is None:
                engine.add_request(req.request_id, req.prompt_token_ids, params,
                                   num_resumed_tokens=req.num_resumed_tokens, cache_salt=req.cache_salt,
                                   priority=req.priority, itl_target_s=req.itl_target_s)
            else:
                # Replay the prefill worker's first token through an identical detokenizer, so that this one
                # releases exactly the text the prefill worker did not (and sees stop strings spanning it).
                detok.add(req.first_token_id)
                engine.add_prefilled(req.request_id, req.prompt_token_ids, req.first_token_id, params, *req.kv,
                                     num_resumed_tokens=req.num_resumed_tokens, cache_salt=req.cache_salt,
                                     priority=req.priority, itl_target_s=req.itl_target_s)
                req.kv = None  # the engine holds it now; drop our reference
        except ValueError as exc:
            req.emit(Event("rejected", message=str(exc)))
            return
        except Exception as exc:  # an engine bug on admission fails this request, not the loop
            log.exception("admitting %s failed", req.request_id)
            engine.abort(req.request_id)
            self.metrics.count_error("engine")
            req.emit(Event("error", message=f"the engine failed to admit the request: {exc}", kind="engine"))
            return
        req.detok, req.num_completion_tokens = detok, req.num_resumed_tokens
        if req.first_token_id is not None:
            req.num_completion_tokens += 1
            req.last_token_at = time.monotonic()
        self._open[req.request_id] = req
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        req.emit(Event("admitted", num_prompt_tokens=req.num_prompt_tokens))

    def _replay(self, detok: IncrementalDetokenizer, req: EngineRequest) -> str | None:
        """Feed a resumed request's earlier tokens to its detokenizer (their text was sent already); return the
        finish reason if they already end the request, else None."""
        resumed = req.prompt_token_ids[req.num_prompt_tokens:]
        for token_id in resumed:
            if detok.add(token_id).stopped:
                return "stop"
        if resumed and not req.params.ignore_eos and resumed[-1] in self.engine.model_runner.eos_token_ids:
            return "stop"
        if resumed and len(resumed) >= req.params.max_tokens:
            return "length"
        return None

    def _finish_replayed(self, req: EngineRequest, detok: IncrementalDetokenizer, finish_reason: str) -> None:
        """A resumed request whose old worker died between its last token and its finish: release what that worker
        held back and finish, as it would have."""
        text = detok.flush()
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        self.metrics.count_success(finish_reason)
        req.emit(Event("admitted", num_prompt_tokens=req.num_prompt_tokens))
        counts = dict(num_prompt_tokens=req.num_prompt_tokens, num_completion_tokens=req.num_resumed_tokens)
        if self.role is Role.PREFILL:  # the prefill handler answers "finished" with no first token
            req.emit(Event("token", token_ids=[], text=text, finish_reason=finish_reason, **counts))
        else:
            req.emit(Event("done", text=text, finish_reason=finish_reason, **counts))

    def _deliver_all(self, outputs) -> None:
        for out in outputs:
            try:
                self._deliver(out)
            except Exception as exc:  # detokenizing one request went wrong: fail that request alone
                log.exception("delivering %s failed", out.request_id)
                self._fail_one(out.request_id, f"worker error while detokenizing: {exc}")

    def _deliver(self, out) -> None:
        req = self._open.get(out.request_id)
        if req is None:  # aborted by its handler; the engine's "abort" output needs no answer
            return
        now = time.monotonic()
        text, stopped = "", False
        token_ids = []
        for token_id in out.new_token_ids:
            token_ids.append(token_id)
            delta = req.detok.add(token_id)
            text += delta.text
            if delta.stopped:
                stopped = True
                break
        finish_reason = "stop" if stopped else (out.finish_reason if out.finished else None)
        if finish_reason is not None and not stopped:
            text += req.detok.flush()
        self._observe_tokens(req, len(token_ids), now)
        if stopped and out.finish_reason is None:
            # A stop string: free the blocks now, not at max_tokens, and before the client hears "done", so that
            # a scrape after it never sees them in use.
            self.engine.abort(req.request_id)
            self._publish_stats()
        if token_ids:
            is_handoff = self.role is Role.PREFILL and finish_reason is None
            req.emit(Event("token", token_ids=token_ids, text=text, kv=out.kv if is_handoff else None,
                           finish_reason=finish_reason if self.role is Role.PREFILL else None,
                           num_prompt_tokens=req.num_prompt_tokens,
                           num_completion_tokens=req.num_completion_tokens))
            if is_handoff:  # the engine forgot this request: its K/V now travels with the event
                del self._open[req.request_id]
                return
        if finish_reason is None:
            return
        del self._open[req.request_id]
        if finish_reason == "abort":
            req.emit(Event("error", message="the request was aborted", kind="abort"))
            return
        self.metrics.count_success(finish_reason)
        self.metrics.e2e_request_latency.observe(now - req.arrival)
        if self.role is not Role.PREFILL:
            req.emit(Event("done", text=text if not token_ids else "", finish_reason=finish_reason,
                           num_prompt_tokens=req.num_prompt_tokens,
                           num_completion_tokens=req.num_completion_tokens))

    def _observe_tokens(self, req: EngineRequest, num_tokens: int, now: float) -> None:
        if not num_tokens:
            return
        self.metrics.generation_tokens.inc(num_tokens)
        if req.last_token_at is None:
            self.metrics.time_to_first_token.observe(now - req.arrival)
        else:
            self.metrics.inter_token_latency.observe(now - req.last_token_at)
        req.num_completion_tokens += num_tokens
        req.last_token_at = now

    def _fail_all(self, kind: str, message: str, *, abort: bool) -> None:
        for request_id, req in list(self._open.items()):
            if abort:
                try:
                    self.engine.abort(request_id)
                except Exception:  # the engine is already in trouble; the request fails either way
                    log.exception("abort of %s failed", request_id)
            req.emit(Event("error", message=message, kind=kind))
            self.metrics.count_error(kind)
        self._open.clear()

    def _fail_one(self, request_id: str, message: str) -> None:
        req = self._open.pop(request_id, None)
        if req is None:
            return
        self.engine.abort(request_id)
        self.metrics.count_error("engine")
        req.emit(Event("error", message=message, kind="engine"))

    def _publish_stats(self, *, step_s: float | None = None) -> None:
        """The engine's stats to /info and /metrics; after a step (`step_s`, its time), that step to the roofline."""
        stats = self.engine.stats()
        self.stats = stats  # one reference swap: readers on other threads see the old dict or the new one
        self.metrics.set_engine_stats(stats)
        num_computed = stats.get("num_prefill_tokens_computed", 0)
        num_new_prefill = max(0, num_computed - self._num_prefill_tokens_seen)
        if num_new_prefill:
            self.metrics.prefill_tokens_computed.inc(num_new_prefill)
            self._num_prefill_tokens_seen = num_computed
        if step_s is not None and self.roofline is not None:
            stage = self.roofline.observe_step(num_tokens=self.engine.num_step_tokens,
                                               num_prefill_tokens=num_new_prefill, seconds=step_s)
            if stage is not None:
                self.metrics.set_roofline(stage, self.roofline.efficiency(stage))
