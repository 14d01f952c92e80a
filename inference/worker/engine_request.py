"""A request on the engine's side and the events it answers with: what the server hands either engine (the real
engine's thread, engine_loop.py, or the simulated engine, sim/engine.py) and what each sends back through the
request's `emit` callback, whatever the engine.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from inference.engine.sequence import STANDARD_PRIORITY
from inference.sampling_params import SamplingParams
from inference.worker.detokenize import TextDecoder


class LoopState(Enum):
    """An engine's life, as /health reports it: loading, serving, unable to serve, stopped at exit."""

    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"
    STOPPED = "stopped"


@dataclass(slots=True)
class Event:
    """One message from the engine to a request's handler."""

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
