"""The replay's moving parts: a request in flight and a worker.

A worker's decode state is kept so that a step costs the same whatever its batch holds (an hour of trace is
hundreds of thousands of steps): the batch is a count and a sum of contexts, each running request's last step
number sits in a heap, and a request's gaps are never stored one by one. A request joining the batch after step
s finishes at step s + output - 1; all requests that ran through a step share its gap (the time since the
previous decode step ended), except those that joined at that step, whose gap starts at their first token.
"""
from __future__ import annotations

import math
from collections import deque
from enum import Enum

from controlplane.capacity.sizing.simulation import StageModel
from controlplane.replay.sim.prefix import PrefixCache


class ReplicaState(Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


class Flight:
    """One request from its arrival to its end (served or shed)."""

    __slots__ = ("index", "arrival", "prompt", "output", "tenant", "band", "hashes", "block_tokens", "key",
                 "counted", "waiter", "dispatched", "first_token", "finished", "shed", "shed_at", "prefill_worker",
                 "decode_worker", "num_cached", "num_uncached", "num_prefilled", "started", "finish_step")

    def __init__(self, index: int, request, band: str, key: str | None, counted: bool) -> None:
        self.index, self.arrival = index, request.arrival_s
        self.prompt, self.output = request.prompt_tokens, request.output_tokens
        self.tenant, self.band, self.key, self.counted = request.tenant, band, key, counted
        self.hashes, self.block_tokens = request.block_hashes, request.block_tokens
        self.waiter = None  # the admission queue's entry while it waits there
        self.dispatched = self.first_token = self.finished = math.nan
        self.shed: str | None = None  # why it was refused, if it was
        self.shed_at = math.nan
        self.prefill_worker: Replica | None = None  # the worker that prefills it (colocated: the only one)
        self.decode_worker: Replica | None = None
        self.num_cached = 0  # prompt tokens found in the prefill worker's cache
        self.num_uncached = 0  # prompt tokens it computes
        self.num_prefilled = 0  # of those, computed so far (chunked prefill)
        self.started = False  # its prefill began (cache looked up, KV reserved on colocated)
        self.finish_step = 0

    def reserved(self) -> int:
        """KV slots reserved for its whole life on a decode or colocated worker."""
        return self.prompt + self.output

    def mean_gap(self) -> float:
        """Mean inter-token gap; 0 for a request of one token."""
        return (self.finished - self.first_token) / (self.output - 1) if self.output > 1 else 0.0


class Replica:
    """One worker of a pool: its queue, its cache, its running batch and its life (started, ready, stopped)."""

    __slots__ = ("role", "name", "url", "weight", "model", "state", "started_at", "ready_at", "stopped_at",
                 "num_outstanding", "last_picked", "waiting", "busy", "busy_s", "window_busy_s", "cache",
                 "step_prefill", "step_batch", "num_steps", "num_running", "num_partial", "context_sum", "kv_used",
                 "finishing", "joined", "last_decode_end")

    def __init__(self, role: str, number: int, model: StageModel, cache_blocks: int, now: float,
                 ready_at: float) -> None:
        self.role, self.model = role, model
        self.name = self.url = f"{role}-{number}"  # url: the gateway's ring hashes workers by it
        self.weight = 1.0
        self.state = ReplicaState.SERVING if ready_at <= now else ReplicaState.STARTING
        self.started_at, self.ready_at, self.stopped_at = now, ready_at, math.nan
        self.num_outstanding = 0  # requests the gateway sent here and that have not left
        self.last_picked = -1
        self.waiting: deque[Flight] = deque()  # prefill: prompts; decode: prefilled requests not yet admitted
        self.busy = False
        self.busy_s = self.window_busy_s = 0.0
        self.cache = PrefixCache(cache_blocks)
        self.step_prefill: list | None = None  # the running step's [(flight, tokens)], None for a decode step
        self.step_batch = 0  # sequences in the running decode step
        self.num_steps = 0  # decode steps done
        self.num_running = 0  # sequences in the decode batch
        self.num_partial = 0  # colocated: sequences whose prefill began and has not ended
        self.context_sum = 0  # tokens the decode batch holds (its KV read by every step)
        self.kv_used = 0
        self.finishing: list = []  # heap of (finish_step, index, flight)
        self.joined: list[Flight] = []  # joined the batch since the last decode step
        self.last_decode_end = math.nan

    @property
    def serving(self) -> bool:
        return self.state is ReplicaState.SERVING

    def up_s(self, horizon: float) -> float:
        """Seconds it was up within the replay, start-up included."""
        end = self.stopped_at if not math.isnan(self.stopped_at) else horizon
        return max(0.0, min(end, horizon) - self.started_at)

    def serving_s(self, horizon: float) -> float:
        end = self.stopped_at if not math.isnan(self.stopped_at) else horizon
        return max(0.0, min(end, horizon) - self.ready_at)
