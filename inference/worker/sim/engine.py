"""The simulated engine: an asyncio scheduler that sleeps a profile's latencies instead of running a model.

Prefill is one request at a time (compute-bound: a real worker's prefill steps do not overlap), taking
`prefill_seconds(prompt tokens)`. Decode is continuous batching: sequences join and leave the running batch between
steps, at most max_num_seqs run, and admission waits while the KV they would hold (kv_bytes_per_token a token)
exceeds the profile's kv_cache_bytes; each step takes `decode_step_seconds(batch, tokens held)` and gives every
running sequence one token. Tokens cycle through a fixed vocabulary (`token_text`), so text is easy to recognise.
"""
from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

from inference.metrics import TandemMetrics
from inference.worker.sim.profile import Profile, RoleProfile

WORDS = ("sim", "tok", "alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel", "india", "juliet")


def tokenize(text: str, vocab_size: int) -> list[int]:
    """A trivial tokenizer: one token per whitespace-separated word, its id a hash of the word."""
    return [zlib.crc32(word.encode()) % (vocab_size - 1) + 1 for word in text.split()]


def token_id(index: int, vocab_size: int) -> int:
    """The id of a request's index-th generated token: the words cycle."""
    return (index % len(WORDS)) % vocab_size


def token_text(token: int) -> str:
    return " " + WORDS[token % len(WORDS)]


@dataclass(slots=True, eq=False)
class SimSequence:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    stop: list[str]
    arrival: float
    num_generated: int = 0  # tokens generated so far (a decode sequence starts at 1: prefill's first token)
    text: str = ""
    finish_reason: str | None = None
    last_token_at: float = 0.0
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("token", id, text) | ("done", reason)
    aborted: bool = False

    @property
    def num_context_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_generated


class SimEngine:
    def __init__(self, profile: Profile, role: str, metrics: TandemMetrics, *, max_num_seqs: int):
        self.profile, self.role = profile, role
        self.costs: RoleProfile = profile.role(role)
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.capacity_tokens = self.costs.kv_cache_bytes // self.costs.kv_bytes_per_token
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []
        self._prefill_lock = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self.heartbeat = time.monotonic()

    # -- prefill ---------------------------------------------------------------------------------------------------

    async def prefill(self, seq: SimSequence) -> int:
        """Sleep the prefill of `seq`'s prompt; return its first token (and count it)."""
        async with self._prefill_lock:
            self.metrics.requests_waiting.inc()
            try:
                await asyncio.sleep(self.costs.prefill_seconds(seq.num_prompt_tokens))
            finally:
                self.metrics.requests_waiting.dec()
        self.metrics.prompt_tokens.inc(seq.num_prompt_tokens)
        self.metrics.prefill_tokens_computed.inc(seq.num_prompt_tokens)
        first = token_id(0, self.profile.vocab_size)
        self._emit(seq, first)
        return first

    # -- decode ----------------------------------------------------------------------------------------------------

    def add(self, seq: SimSequence) -> None:
        """Join the decode batch (it waits for room: batch size and KV)."""
        self.waiting.append(seq)
        self._wakeup.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._decode_loop())

    def abort(self, seq: SimSequence) -> None:
        seq.aborted = True
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self._update_gauges()

    def _held_tokens(self) -> int:
        return sum(s.num_prompt_tokens + s.max_tokens for s in self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.running and self._held_tokens() + seq.num_prompt_tokens + seq.max_tokens > self.capacity_tokens:
                break  # waits for KV, as a real decode worker's reservation does
            self.running.append(self.waiting.popleft())

    async def _decode_loop(self) -> None:
        while True:
            self.heartbeat = time.monotonic()
            self._admit()
            self._update_gauges()
            if not self.running:
                if not self.waiting:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = list(self.running)
            context = sum(s.num_context_tokens for s in batch)
            await asyncio.sleep(self.costs.decode_step_seconds(len(batch), context))
            for seq in batch:
                if seq.aborted:
                    continue
                self._emit(seq, token_id(seq.num_generated, self.profile.vocab_size))
                if seq.finish_reason is not None:
                    self.running.remove(seq)

    def _emit(self, seq: SimSequence, token: int) -> None:
        now = time.monotonic()
        if seq.num_generated == 0:
            self.metrics.time_to_first_token.observe(now - seq.arrival)
        elif seq.last_token_at:
            self.metrics.inter_token_latency.observe(now - seq.last_token_at)
        seq.last_token_at = now
        seq.num_generated += 1
        text = token_text(token)
        before = len(seq.text)
        seq.text += text
        self.metrics.generation_tokens.inc()
        cuts = [i for i in (seq.text.find(s) for s in seq.stop if s) if i >= 0]
        if cuts:
            # As OpenAI: the stop string and what follows are not returned. Text is never held back here, so a
            # stop string that spans tokens cuts only the token that completes it.
            seq.text = seq.text[:min(cuts)]
            text = text[:max(0, min(cuts) - before)]
            seq.finish_reason = "stop"
        elif seq.num_generated >= seq.max_tokens:
            seq.finish_reason = "length"
        seq.events.put_nowait(("token", token, text))
        if seq.finish_reason is not None and self.role != "prefill":
            self.metrics.count_success(seq.finish_reason)
            self.metrics.e2e_request_latency.observe(now - seq.arrival)
            seq.events.put_nowait(("done", seq.finish_reason))

    def _update_gauges(self) -> None:
        self.metrics.requests_running.set(len(self.running))
        self.metrics.requests_waiting.set(len(self.waiting))
        held = sum(s.num_context_tokens for s in self.running)
        self.metrics.kv_cache_usage.set(min(1.0, held / max(1, self.capacity_tokens)))
