"""The worker's two seams: what its one server drives (a `WorkerEngine`) and what its role handlers use (`RoleHost`).

A `WorkerEngine` is the model (`model_engine.ModelEngine`: the engine thread around `inference.engine`) or a profile
(`sim.engine.SimEngine`: latencies slept on the event loop, no torch). Everything on the HTTP side (admission, bodies,
errors, jobs, the NDJSON stream, the KV push) is the server's alone, so a real and a simulated worker cannot drift.
Both engines take `EngineRequest`s and answer each through its `emit` callback with `Event`s (engine_request.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from inference.engine.sequence import STANDARD_PRIORITY
from inference.metrics import TandemMetrics
from inference.worker.config import WorkerConfig
from inference.worker.engine_request import EngineRequest, LoopState
from inference.worker.jobs import Job
from inference.worker.protocol import GenerateRequest


class KVCodec(Protocol):
    """The KV handoff payload (docs/contracts.md, "Decode: POST /v1/kv"): real tensors, or the simulated zeros."""

    def body_limit(self, info: dict) -> int:
        """The largest payload a decode worker of this model reads; a bigger body is a 413."""

    async def encode(self, header: dict, kv: tuple) -> bytes:
        """`header`: the `tandem` header's fields; `kv`: the prefill event's (k, v)."""

    async def decode(self, body: bytes, *, kv_layout: dict, revision: str | None) -> tuple[dict, tuple]:
        """(header, kv) of a payload that fits this worker; ValueError with a message for the sender otherwise."""


class WorkerEngine(Protocol):
    """What computes a worker's tokens, driven by the server.

    Life: `start()` returns at once and loads in the background (`state` STARTING, then READY or DEAD with `reason`);
    `wait_loaded()` returns the worker's /info once loaded (None: loading failed); `stop()` at exit. /health is ok
    while `state` is READY, `is_alive()` and the last tick is recent (`seconds_since_heartbeat`).
    """

    simulated: bool
    state: LoopState
    reason: str
    stats: dict  # the engine's counters and gauges, as /info and /metrics read them
    vocab_size: int  # once loaded
    kv: KVCodec

    def start(self) -> None: ...

    async def wait_loaded(self) -> dict | None: ...

    def stop(self) -> None: ...

    def is_alive(self) -> bool: ...

    def seconds_since_heartbeat(self) -> float: ...

    async def tokenize(self, prompt: str | None, messages: list[dict] | None) -> list[int]:
        """The prompt's token ids (a chat template applied to `messages`); RequestError naming what is refused."""

    def submit(self, request: EngineRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...


class RoleHost(Protocol):
    """What a role's handlers (colocated.py, prefill.py, decode.py) use of the server: reading an admitted request,
    the jobs it opens and closes, and the loaded model's facts. `server.WorkerServer` is the one implementation."""

    config: WorkerConfig
    metrics: TandemMetrics
    info: dict  # /info of the loaded model (kv_layout, max_model_len, ...)
    vocab_size: int
    kv: KVCodec

    async def read_body(self, request: web.Request, limit: int | Callable[[dict], int]) -> bytes:
        """Admit the request (draining, readiness, the in-flight limit), then read at most `limit` (a callable:
        of the loaded model's info, asked once admitted)."""

    async def read_generate(self, request: web.Request, *, need_decode_url: bool) -> tuple[GenerateRequest,
                                                                                            list[int]]:
        """An admitted /v1/generate or /v1/prefill body, checked, tokenized and fitted to this worker's context."""

    def open_job(self, request_id: str | None, arrival: float) -> Job: ...

    def find_job(self, request_id: str) -> Job | None: ...

    def submit(self, job: Job, prompt_token_ids: list[int], params, stop: list[str], *,
               first_token_id: int | None = None, kv: tuple | None = None, num_resumed_tokens: int = 0,
               cache_salt: bytes = b"", priority: int = STANDARD_PRIORITY) -> None: ...

    def close_job(self, job: Job, *, kind: str = "client_disconnect") -> None: ...
