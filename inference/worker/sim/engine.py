"""The simulated engine: a WorkerEngine (inference.worker.seams) that sleeps a profile's latencies on the event loop
instead of running a model, behind the same server as a real worker.

Prefill is one request at a time (compute-bound: a real worker's prefill steps do not overlap), taking
`prefill_seconds(prompt tokens)`. Waiting requests take their turn by priority band, as the real scheduler admits
them (inference/engine/scheduler.py): the best band first, first come first served within it, and a request moves
up one band per PRIORITY_AGING_S seconds since it queued, so that no band starves. So does a request waiting to
join the decode batch. Decode is continuous batching: sequences join and leave the running batch between
steps, at most max_num_seqs run, and admission waits while the KV they would hold (kv_bytes_per_token a token)
exceeds the profile's kv_cache_bytes; each step takes `decode_step_seconds(batch, tokens held)` and gives every
running sequence one token. On the colocated role the two overlap. Tokens cycle through a fixed vocabulary
(`token_text`), so text is easy to recognise. No thread and no timer per worker: many run in one process
(inference/worker/sim_host.py).
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

from prometheus_client import Gauge

from inference.engine.scheduler import PRIORITY_AGING_S
from inference.metrics import TandemMetrics
from inference.roles import Role
from inference.worker.config import WorkerConfig
from inference.worker.detokenize import Delta
from inference.worker.engine_request import EngineRequest, Event, LoopState
from inference.worker.sim.kv import FakeKV
from inference.worker.sim_profile import RoleProfile, SimSettings
from inference.worker.sim.words import SimText, token_id, tokenize


class SimEngine:
    simulated = True

    def __init__(self, config: WorkerConfig, metrics: TandemMetrics):
        assert isinstance(config.engine, SimSettings)
        self.config, self.settings = config, config.engine
        self.profile, self.role = config.engine.profile, config.engine.role
        self.costs: RoleProfile = self.profile.role(self.role)
        self.metrics = metrics
        self.capacity_tokens = self.costs.kv_cache_bytes // self.costs.kv_bytes_per_token
        self.vocab_size = self.profile.vocab_size
        self.kv = FakeKV(self.profile.kv_layout)
        self.state, self.reason = LoopState.STARTING, "loading the model (simulated)"
        self.stats: dict = {}
        self.open: dict[str, EngineRequest] = {}
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        # The prefill turn: whether one is under way, and the requests waiting for it, each with when it queued and
        # the future that hands it the turn.
        self._prefilling = False
        self._prefill_waiters: list[tuple[EngineRequest, float, asyncio.Future]] = []
        self._queued_at: dict[str, float] = {}  # request id -> when it joined the batch queue
        self._wakeup = asyncio.Event()
        self._decode_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        # Cleared while the host holds this worker as a stopped process (SimHost's pause): no step completes.
        self._unheld = asyncio.Event()
        self._unheld.set()

    # -- life ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.state, self.reason = LoopState.READY, ""

    async def wait_loaded(self) -> dict | None:
        config, layout = self.config, self.profile.kv_layout
        self.metrics.set_worker_info(dtype=layout["dtype"], dtype_requested=layout["dtype"],
                                     revision=config.revision or "")
        Gauge("tandem_worker_simulated", "1: this worker is simulated (no model; latencies from a profile).",
              ("role", "model", "profile"), registry=self.metrics.registry).labels(
            role=self.role, model=config.model_name, profile=self.profile.name).set(1)
        return {"role": self.role, "model": config.model_name, "model_path": self.settings.model,
                "revision": config.revision, "dtype": layout["dtype"], "dtype_requested": layout["dtype"],
                "dtype_reason": "simulated: the KV layout's dtype",
                "max_model_len": min(self.profile.max_model_len, self.capacity_tokens),
                "configured_max_model_len": self.profile.max_model_len,
                "max_num_seqs": self.settings.max_num_seqs, "max_num_batched_tokens": None,
                "kv_layout": dict(layout), "quantization": "none", "weight_bytes": 0, "bit_identical": True,
                # No KV blocks held, so no prompt prefix reused: said as a real worker with prefix caching off says
                # it (the gateway's and pages' reading of /health, /info).
                "prefix_caching": False, "speculative": None,
                "simulated": True, "profile": self.profile.name, "kv_bytes_per_token": self.costs.kv_bytes_per_token}

    def stop(self) -> None:
        for task in [*self._tasks, self._decode_task]:
            if task is not None:
                task.cancel()
        if self.state is LoopState.READY:
            self.state, self.reason = LoopState.STOPPED, "stopped"

    def is_alive(self) -> bool:
        return self.state is not LoopState.DEAD

    @property
    def idle(self) -> bool:
        """Nothing open and nothing under way: none of this engine's series changes until a request comes
        (the host serves an idle worker's /metrics from memory on that account)."""
        return not self.open and not self._tasks and (self._decode_task is None or self._decode_task.done())

    def hold(self) -> None:
        """Make no progress, as a stopped (SIGSTOP) process makes none: the step under way completes only once
        released; its tokens come late, never lost."""
        self._unheld.clear()

    def release(self) -> None:
        self._unheld.set()

    def seconds_since_heartbeat(self) -> float:
        """Zero: nothing here can get stuck on its own (a stopped process answers nothing at all)."""
        return 0.0

    async def tokenize(self, prompt: str | None, messages: list[dict] | None) -> list[int]:
        text = prompt if prompt is not None else " ".join(m["content"] for m in messages)
        return tokenize(text, self.vocab_size) or [1]

    # -- requests --------------------------------------------------------------------------------------------------

    def submit(self, req: EngineRequest) -> None:
        """Admit at once (decode sequences then wait for room in the batch); prefill runs in a task of its own."""
        if req.request_id in self.open:
            req.emit(Event("rejected", message=f"request_id {req.request_id!r} is already running on this worker"))
            return
        req.detok = SimText(req.stop)
        resumed = req.prompt_token_ids[req.num_prompt_tokens:]
        finish_reason = None
        for token in resumed:  # a resumed request's earlier tokens: their text was sent already
            if req.detok.add(token).stopped:
                finish_reason = "stop"
                break
        req.num_completion_tokens = len(resumed)
        if finish_reason is None and resumed and len(resumed) >= req.params.max_tokens:
            finish_reason = "length"
        req.emit(Event("admitted", num_prompt_tokens=req.num_prompt_tokens))
        if finish_reason is not None:
            self._finish(req, finish_reason, "")
            return
        self.open[req.request_id] = req
        if req.first_token_id is not None:  # decode role: the prefill worker generated the first token
            req.num_completion_tokens += 1
            req.last_token_at = req.arrival
            self._join_batch(req)
            return
        task = asyncio.get_running_loop().create_task(self._prefill(req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def abort(self, request_id: str) -> None:
        req = self.open.pop(request_id, None)
        if req is None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        self._queued_at.pop(request_id, None)
        if req in self.running:
            self.running.remove(req)
        self._update_gauges()

    async def _prefill(self, req: EngineRequest) -> None:
        await self._prefill_turn(req)
        try:
            if self.open.get(req.request_id) is not req:
                return  # aborted while it waited for its turn: a real engine drops it from its waiting queue
            self.metrics.requests_waiting.inc()
            try:
                await asyncio.sleep(self.costs.prefill_seconds(len(req.prompt_token_ids)))
                await self._unheld.wait()
            finally:
                self.metrics.requests_waiting.dec()
        finally:
            self._next_prefill()
        if self.open.get(req.request_id) is not req:
            return  # aborted meanwhile
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        self.metrics.prefill_tokens_computed.inc(len(req.prompt_token_ids))
        finish_reason = self._emit_token(req)
        if self.role is Role.PREFILL or finish_reason is not None:
            del self.open[req.request_id]
        elif self.role is Role.COLOCATED:
            self._join_batch(req)

    async def _prefill_turn(self, req: EngineRequest) -> None:
        if not self._prefilling:
            self._prefilling = True
            return
        turn = asyncio.get_running_loop().create_future()
        self._prefill_waiters.append((req, time.monotonic(), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._next_prefill()  # it was handed the turn as it was cancelled: pass it on
            else:
                self._prefill_waiters = [w for w in self._prefill_waiters if w[2] is not turn]
            raise

    def _next_prefill(self) -> None:
        """Hand the prefill turn to the waiting request of the best band (aged), the oldest within it."""
        if not self._prefill_waiters:
            self._prefilling = False
            return
        now = time.monotonic()
        best = min(range(len(self._prefill_waiters)), key=lambda i: self._band(
            self._prefill_waiters[i][0], now - self._prefill_waiters[i][1]))  # min: the first of equals
        self._prefill_waiters.pop(best)[2].set_result(None)

    @staticmethod
    def _band(req: EngineRequest, waited_s: float) -> int:
        return max(0, req.priority - int(waited_s / PRIORITY_AGING_S))

    def _join_batch(self, req: EngineRequest) -> None:
        self._queued_at[req.request_id] = time.monotonic()
        self.waiting.append(req)
        self._wakeup.set()
        if self._decode_task is None or self._decode_task.done():
            self._decode_task = asyncio.get_running_loop().create_task(self._decode_loop())

    def _held_tokens(self) -> int:
        return sum(r.num_prompt_tokens + r.params.max_tokens for r in self.running)

    def _admit(self) -> None:
        """Join waiting requests to the batch, best band first (stable: FIFO within a band), stopping at the first
        that does not fit, as the real scheduler's admission does."""
        now = time.monotonic()
        order = sorted(self.waiting, key=lambda r: self._band(r, now - self._queued_at.get(r.request_id, now)))
        for req in order:
            if len(self.running) >= self.settings.max_num_seqs:
                break
            if self.running and self._held_tokens() + req.num_prompt_tokens + req.params.max_tokens \
                    > self.capacity_tokens:
                break  # waits for KV, as a real decode worker's reservation does
            self.waiting.remove(req)
            self._queued_at.pop(req.request_id, None)
            self.running.append(req)

    async def _decode_loop(self) -> None:
        while True:
            self._admit()
            self._update_gauges()
            if not self.running:
                if not self.waiting:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = list(self.running)
            context = sum(r.num_prompt_tokens + r.num_completion_tokens for r in batch)
            await asyncio.sleep(self.costs.decode_step_seconds(len(batch), context))
            await self._unheld.wait()
            for req in batch:
                if self.open.get(req.request_id) is not req:
                    continue  # aborted during the step
                if self._emit_token(req) is not None:
                    self.running.remove(req)
                    del self.open[req.request_id]

    def _emit_token(self, req: EngineRequest) -> str | None:
        """Give `req` its next token; return its finish reason if that token ends it."""
        now = time.monotonic()
        if req.last_token_at is None:
            self.metrics.time_to_first_token.observe(now - req.arrival)
        else:
            self.metrics.inter_token_latency.observe(now - req.last_token_at)
        req.last_token_at = now
        token = token_id(req.num_completion_tokens, self.vocab_size)
        req.num_completion_tokens += 1
        self.metrics.generation_tokens.inc()
        delta: Delta = req.detok.add(token)
        finish_reason = "stop" if delta.stopped else (
            "length" if req.num_completion_tokens >= req.params.max_tokens else None)
        counts = dict(num_prompt_tokens=req.num_prompt_tokens, num_completion_tokens=req.num_completion_tokens)
        if self.role is Role.PREFILL:  # one event: the handoff (an empty K/V), or the finish
            req.emit(Event("token", token_ids=[token], text=delta.text, finish_reason=finish_reason,
                           kv=() if finish_reason is None else None, **counts))
            if finish_reason is not None:
                self.metrics.count_success(finish_reason)
                self.metrics.e2e_request_latency.observe(now - req.arrival)
            return finish_reason
        req.emit(Event("token", token_ids=[token], text=delta.text, **counts))
        if finish_reason is not None:
            self._finish(req, finish_reason, "", now=now)
        return finish_reason

    def _finish(self, req: EngineRequest, finish_reason: str, text: str, *, now: float | None = None) -> None:
        self.metrics.count_success(finish_reason)
        self.metrics.e2e_request_latency.observe((now or time.monotonic()) - req.arrival)
        counts = dict(num_prompt_tokens=req.num_prompt_tokens, num_completion_tokens=req.num_completion_tokens)
        if self.role is Role.PREFILL:  # the prefill handler answers "finished" with no first token
            req.emit(Event("token", token_ids=[], text=text, finish_reason=finish_reason, **counts))
        else:
            req.emit(Event("done", text=text, finish_reason=finish_reason, **counts))

    def _update_gauges(self) -> None:
        self.metrics.requests_running.set(len(self.running))
        self.metrics.requests_waiting.set(len(self.waiting))
        held = sum(r.num_prompt_tokens + r.num_completion_tokens for r in self.running)
        self.metrics.kv_cache_usage.set(min(1.0, held / max(1, self.capacity_tokens)))
