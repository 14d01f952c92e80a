"""A request inside the engine: its tokens, sampling parameters, state and KV blocks. Never imports torch.

`SamplingParams` is defined (and validated) in `inference.sampling_params`, which the worker and the gateway share.
"""
from __future__ import annotations

from enum import Enum, auto
from typing import Any

from inference.sampling_params import SamplingParams

# The gateway's priority classes, in the order a worker admits waiting requests (a request names one in its body;
# none: standard). The gateway's admission queue dispatches in the same order (inference/gateway/admission.py).
PRIORITY_BANDS = ("interactive", "standard", "batch")
STANDARD_PRIORITY = PRIORITY_BANDS.index("standard")


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """One request. `token_ids` holds the prompt followed by every sampled token.

    `num_cached_tokens` counts the leading tokens whose K/V sit in this sequence's blocks; the last token of a running
    sequence is never cached yet (the next step feeds it). With chunked prefill a running sequence may be partly
    prefilled (`is_prefilling`, 0 < num_cached_tokens < num_tokens); `num_scheduled_tokens` is how many tokens after
    the cached ones the current step feeds (set by the scheduler: a whole prompt, a chunk of it, or 1 to decode).

    The engine's device code hangs opaque tensors on `kv_import` (decode role: K/V received from a prefill worker, to
    place into the blocks at admission) and `kv_export` (prefill role: K/V copied out after prefill); this module
    only carries them.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 num_resumed_tokens: int = 0, cache_salt: bytes = b"", num_shared_tokens: int = 0):
        assert prompt_token_ids, "an empty prompt is rejected at the edge"
        assert 0 <= num_resumed_tokens < len(prompt_token_ids), "resumed tokens follow a prompt"
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        # A resumed request (a worker died mid-stream) has the tokens it generated there at the end of its prompt:
        # the engine computes them as prompt, the penalties count them as generated.
        self.num_resumed_tokens = num_resumed_tokens
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        # Prefix caching (prefix_cache.py): the keys of its full blocks, computed once; how many of its blocks the
        # block manager has keyed.
        self.block_hashes: list[bytes] = []
        self.num_registered_blocks = 0
        # Its tenant's salt for those keys (b"": none), and how many leading tokens are the deployment's shared
        # prompt, whose blocks are keyed unsalted (prefix_cache.py).
        self.cache_salt = cache_salt
        self.num_shared_tokens = num_shared_tokens
        # Until a step samples from it: its tokens are prefilled (in one step or in chunks), not decoded. Set again
        # when a preempted sequence starts over; a decode role's sequence arrives prefilled.
        self.is_prefilling = True
        self.num_steps_starved = 0  # consecutive steps this sequence waited for prefill tokens and got none
        # Its band in the waiting queue (an index into PRIORITY_BANDS: the gateway's class for its tenant) and when
        # it was first queued (the scheduler's clock), from which it ages into better bands (scheduler.py).
        self.priority = STANDARD_PRIORITY
        self.queued_at = 0.0
        # Its deployment's ITL objective in seconds (the gateway sends it; None: none), which bounds the decode
        # batch it runs in (batch_limit.py).
        self.itl_target_s: float | None = None
        self.finish_reason: str | None = None
        self.kv_import: Any = None
        self.kv_export: Any = None

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_prompt_tokens}"
                f"+{self.num_completion_tokens}, blocks={len(self.block_table)})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def output_token_ids(self) -> list[int]:
        """Every token the request generated so far, resumed ones first: what presence and frequency penalties count."""
        return self.token_ids[self.num_prompt_tokens - self.num_resumed_tokens:]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncached_tokens(self) -> int:
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def samples_next_token(self) -> bool:
        """Whether this step's tokens reach the end of the sequence, so that the step samples its next token."""
        return self.num_cached_tokens + self.num_scheduled_tokens == len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

