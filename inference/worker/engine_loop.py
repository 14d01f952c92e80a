"""The thread that owns the engine: it loads the model, steps, detokenizes, and hands events to asyncio.

The engine is not thread-safe, and its steps are long blocking torch calls, so exactly one thread touches it. The
HTTP side talks to that thread through a queue of commands (`submit`, `abort`); the thread answers each request
through its `emit` callback, which the server builds on `loop.call_soon_threadsafe`, so no asyncio object is ever
touched from this thread.

Liveness: the loop stamps `heartbeat` on every iteration; when idle it blocks on its command queue for at most
IDLE_WAIT_S, so the stamp stays fresh on an idle worker too. A step that raises fails the requests of the engine (the
engine may be half-way through them) and the loop goes on; MAX_CONSECUTIVE_STEP_FAILURES in a row mean the engine
is broken, and the thread dies: `/health` reports dead, and every request still open gets an error event.

What becomes of each request (admission, its events, its failure) is open_requests.py's; this module drives the
engine and accounts for its steps: their time (less the prefills run between a step's layers), the engine's stats on
/info and /metrics, and each step against the host's roofline.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from inference.metrics import TandemMetrics
from inference.roles import Role
from inference.worker.engine_request import EngineRequest, LoopState
from inference.worker.open_requests import OpenRequests

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.1
MAX_CONSECUTIVE_STEP_FAILURES = 3


class EngineLoop:
    def __init__(self, make_engine: Callable[[], object], metrics: TandemMetrics, *, role: Role):
        self.make_engine = make_engine
        self.metrics = metrics
        self.role = role
        self.state = LoopState.STARTING
        self.reason = "loading the model"
        self.heartbeat = time.monotonic()
        self.engine = None
        self.requests: OpenRequests | None = None  # once the engine is loaded
        self.stats: dict = {}
        self.loaded = threading.Event()  # set once loading ended, either way
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
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
        self.requests = OpenRequests(self.engine, self.metrics, role=self.role, on_freed=self._publish_stats)
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
            self.requests.fail_all("engine", f"the engine loop stopped: {self.reason}", abort=False)

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
                self.requests.fail_all("engine", f"engine step failed: {exc}", abort=True)
                if num_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                    raise
                continue
            # Stats first: a client that sees a token and then scrapes /metrics sees this step counted.
            self._publish_stats(step_s=step_s)
            self.requests.deliver_all(outputs)

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
            self.requests.deliver_all(outputs)
        self._between_s = nested_before + elapsed

    def _apply_commands(self, *, block: bool) -> None:
        try:
            command = self._commands.get(timeout=IDLE_WAIT_S) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = command
            if kind == "submit":
                self.requests.admit(arg)
            elif kind == "abort":
                self.requests.abort(arg)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

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
