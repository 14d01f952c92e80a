"""The engine: requests in, one step at a time, tokens out. Not thread-safe: one thread owns an engine."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

from transformers import AutoTokenizer

from inference.engine.batch_limit import checked_target
from inference.engine.block_manager import BlockManager
from inference.engine.config import Config
from inference.engine.interleave import Arrivals
from inference.engine.model_runner import ModelRunner
from inference.engine.prefix_cache import num_shared_tokens, shared_prompt_ids
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import PRIORITY_BANDS, STANDARD_PRIORITY, SamplingParams, Sequence
from inference.engine.speculation_policy import Speculator, parse_speculative
from inference.engine.step_pause import StepPause
from inference.roles import Role


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one request.

    On the prefill role every request yields exactly one StepOutput, with its first token and `kv` (K and V, each
    [num_layers, num_prompt_tokens, num_kv_heads, head_dim], CPU), once its whole prompt is prefilled (with chunked
    prefill, after its last chunk); the engine forgets the request after it. `finished`
    is true there only when the first token already ends the request ("stop" or "length"), i.e. nothing is to be
    handed to a decode worker. An EOS token that ends a request is included in `new_token_ids`.
    """
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    kv: tuple[Any, Any] | None = None


class LLMEngine:
    def __init__(self, config: Config):
        self.config = config
        self.model_runner = ModelRunner(config)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True)
        runner = self.model_runner
        # The context a request can have: the model's (or config.max_model_len), or less where the KV pool holds less.
        self.max_model_len = runner.pool.max_model_len
        self.configured_max_model_len = runner.pool.configured_max_model_len
        self.kv_layout = runner.pool.kv_layout
        self.dtype: str = runner.dtype_name  # what runs: config.dtype with "auto" resolved
        self.dtype_reason: str = runner.dtype_reason
        self.kv_cache_dtype: str = runner.kv_dtype_name  # the KV cache's (and the handoff's)
        self.kv_cache_dtype_reason: str = runner.kv_dtype_reason
        self.quantization: str = config.quantization
        self.weight_bytes: int = runner.weight_bytes
        # compile: {"enabled", "backend", "mode", "warmup_s", "fallback" (why it runs eager, or None)} for /info.
        self.compile_info: dict = runner.compile_info
        # How the float weights lie in memory and why (fusion.choose_weight_layout), for /info.
        self.weight_layout: dict = {"setting": config.weight_layout, "layout": runner.plan.weight_layout,
                                    "reason": runner.plan.weight_layout_reason}
        # Who multiplies a decode step's tokens by the float linears, and the other kernels, and why (kernel_plan.py).
        self.matvec: dict = runner.matvec_info
        self.decode_step_ops: int | None = runner.decode_step_ops  # one single-stream step's tensor ops
        # What runs: a decode engine computes no prompt, so it has no use for a prefix cache.
        self.prefix_caching = config.prefix_caching and config.role is not Role.DECODE
        self.block_manager = BlockManager(self.model_runner.num_blocks, config.block_size,
                                          enable_prefix_caching=self.prefix_caching)
        self.shared_prefixes = shared_prompt_ids(self.tokenizer, config.shared_prompt) if self.prefix_caching else []
        self.scheduler = Scheduler(role=config.role, block_manager=self.block_manager,
                                   max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_model_len=self.max_model_len, eos_token_ids=self.model_runner.eos_token_ids,
                                   chunked_prefill=config.chunked_prefill,
                                   prefill_chunk_size=config.prefill_chunk_size,
                                   prefill_chunk_size_alone=config.prefill_chunk_size_alone)
        spec = parse_speculative(config.speculative)
        self.speculative: dict | None = config.speculative
        self.speculator = None if spec is None else Speculator(
            spec, decoder=self.model_runner.spec_decoder(spec.layers),
            block_manager=self.block_manager, max_model_len=self.max_model_len, role=config.role)
        self._seqs: dict[str, Sequence] = {}  # unfinished requests by id
        self._pending_outputs: list[StepOutput] = []  # produced outside a step (aborts), returned by the next step
        self._generate_ids = count()
        # Prefill between a step's layers (interleave.py): the flag the engine loop raises on a command, and the
        # step under way's side of it (step_pause.py).
        self.arrivals = Arrivals()
        self.interleave_prefill, self.interleave_reason = self._interleave_choice()
        self.pauses = StepPause(self.arrivals, self.scheduler, self.model_runner.run, self._outputs)
        self.num_step_tokens = 0  # tokens the last step fed to the model, prefill and decode together (0: no forward)

    # -- requests -------------------------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    num_resumed_tokens: int = 0, cache_salt: bytes = b"", priority: int = STANDARD_PRIORITY,
                    itl_target_s: float | None = None) -> None:
        """`num_resumed_tokens`: the last that many of `prompt_token_ids` were generated by this request before, on a
        worker that died; the penalties count them as generated. `cache_salt` (at most 64 bytes; its tenant's): its
        prefix-cache blocks are shared only with requests of the same salt, but for the shared prompt's. `priority`:
        its band, an index into PRIORITY_BANDS (the scheduler admits waiting sequences band first). `itl_target_s`:
        its deployment's ITL objective, which bounds the decode batch (batch_limit.py)."""
        if self.config.role is Role.DECODE:
            raise ValueError("a decode engine takes prefilled requests only (add_prefilled)")
        if not isinstance(cache_salt, bytes) or len(cache_salt) > 64:
            raise ValueError("cache_salt must be at most 64 bytes")
        if priority not in range(len(PRIORITY_BANDS)):
            raise ValueError(f"priority must be an index into {PRIORITY_BANDS}, got {priority!r}")
        seq = self._new_sequence(request_id, prompt_token_ids, params, num_resumed_tokens)
        seq.priority = priority
        seq.itl_target_s = checked_target(itl_target_s)
        if cache_salt:
            seq.cache_salt = cache_salt
            seq.num_shared_tokens = num_shared_tokens(seq.token_ids, self.shared_prefixes)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def add_prefilled(self, request_id: str, prompt_token_ids: list[int], first_token_id: int,
                      params: SamplingParams, k, v, *, num_resumed_tokens: int = 0, cache_salt: bytes = b"",
                      priority: int = STANDARD_PRIORITY, itl_target_s: float | None = None) -> None:
        """Decode role: continue a request whose prompt a prefill engine computed; k, v as StepOutput.kv;
        `num_resumed_tokens`, `cache_salt` (here only its tenant for the admission order: a decode engine caches no
        prefixes), `priority` and `itl_target_s` as in add_request."""
        if self.config.role is not Role.DECODE:
            raise ValueError(f"add_prefilled needs role decode, this engine's role is {self.config.role}")
        seq = self._new_sequence(request_id, prompt_token_ids, params, num_resumed_tokens)
        self._check_token_id(first_token_id, "first_token_id")
        self.model_runner.pool.validate_kv(k, v, seq.num_prompt_tokens)
        seq.append_token(first_token_id)
        seq.finish_reason = self.scheduler.finish_reason(seq)
        if seq.finish_reason is not None:  # the first token already ends it: nothing to decode
            self._pending_outputs.append(StepOutput(request_id, [], True, seq.finish_reason))
            return
        if priority not in range(len(PRIORITY_BANDS)):
            raise ValueError(f"priority must be an index into {PRIORITY_BANDS}, got {priority!r}")
        seq.priority, seq.cache_salt = priority, cache_salt
        seq.itl_target_s = checked_target(itl_target_s)
        seq.kv_import = (k, v)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> None:
        """Free the request's blocks; the next step reports it finished with reason "abort". Unknown ids: ignored.
        A request of a paused step (prefill_between) leaves when that step ends: its slots are being written."""
        if self.pauses.holds(request_id):
            return
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        self.scheduler.abort(request_id)
        seq.kv_import = None
        self._pending_outputs.append(StepOutput(request_id, [], True, "abort"))

    # -- the loop -------------------------------------------------------------------------------------------------

    def step(self, between: Callable[[], None] | None = None) -> list[StepOutput]:
        """One step. `between` (the engine loop's): where interleave_prefill is on, a step (decode, prefill or mixed)
        whose `arrivals` flag is raised pauses between layers and calls it; it takes the new commands and may call
        prefill_between."""
        outputs, self._pending_outputs = self._pending_outputs, []
        if between is not None and self.interleave_prefill and self.scheduler.chunked_prefill:
            first = self.pauses.prefill_first(between)
            if first is not None:
                self.num_step_tokens = self.pauses.num_tokens
                return outputs + self._free_leaving(first)
        seqs, is_prefill = self.scheduler.schedule()
        num_step_tokens = self.num_step_tokens = self.scheduler.num_batched_tokens
        if not seqs:
            return outputs
        if self.speculator is not None and not is_prefill:
            # A decode step with drafts: several tokens per sequence (postprocess stops at the first that ends it).
            token_ids = self.speculator.step(seqs)
            num_step_tokens += self.speculator.num_draft_tokens_fed
        elif between is not None and self.interleave_prefill:
            started = time.perf_counter()
            token_ids, prefilled_between = self.pauses.run_step(seqs, is_prefill, between)
            if not prefilled_between:
                self._record_decode_step(seqs, is_prefill, num_step_tokens, time.perf_counter() - started)
        else:
            started = time.perf_counter()
            token_ids = self.model_runner.run(seqs, is_prefill)
            self._record_decode_step(seqs, is_prefill, num_step_tokens, time.perf_counter() - started)
        self.num_step_tokens = num_step_tokens
        return self._free_leaving(outputs + self._outputs(seqs, token_ids, is_prefill))

    def _free_leaving(self, outputs: list[StepOutput]) -> list[StepOutput]:
        for request_id in self.pauses.take_leaving():  # aborted while the step ran: its blocks are free to take now
            self.abort(request_id)
        return outputs

    def _record_decode_step(self, seqs: list[Sequence], is_prefill: bool, num_step_tokens: int,
                            seconds: float) -> None:
        """A pure decode step (one token per sequence, no prefill beside it) is what the batch limit fits."""
        if not is_prefill and num_step_tokens == len(seqs):
            self.scheduler.step_times.record(len(seqs), seconds)

    def prefill_between(self) -> list[StepOutput]:
        """While a step is paused (in its `between`): prefill the waiting requests that can start now and return
        their first tokens (step_pause.StepPause.prefill_between); num_step_tokens is this prefill's until the paused
        step ends. Its sequences are in flight like the paused step's: an abort of one takes effect when the step
        ends."""
        outputs = self.pauses.prefill_between()
        self.num_step_tokens = self.pauses.num_tokens
        return outputs

    def _outputs(self, seqs: list[Sequence], token_ids: list, is_prefill: bool) -> list[StepOutput]:
        num_tokens_before = [seq.num_tokens for seq in seqs]
        self.scheduler.postprocess(seqs, token_ids, is_prefill)
        outputs = []
        for seq, token_id, num_before in zip(seqs, token_ids, num_tokens_before):
            if token_id is None:  # a prefill chunk short of the prompt's end: nothing to report yet
                continue
            outputs.append(StepOutput(seq.request_id, seq.token_ids[num_before:], seq.finish_reason is not None,
                                      seq.finish_reason, seq.kv_export))
            seq.kv_export = None
            if seq.is_finished:
                del self._seqs[seq.request_id]
        return outputs

    def _interleave_choice(self) -> tuple[bool, str]:
        """(whether a step prefills arrivals between its layers, why) for /info."""
        if not self.config.interleave_prefill:
            return False, "off: interleave_prefill is false (an arrival waits for the step's end)"
        if self.config.role is not Role.COLOCATED:
            return False, f"off: a {self.config.role} engine does not both prefill and decode"
        if self.speculator is not None:
            return False, "off: speculative decode steps run drafts, not the lean forward's layers"
        if not self.model_runner.can_pause:
            return False, "off: the decode step is compiled or runs the reference forward (no layer loop to pause)"
        chunk = (f"a prompt of up to {self.scheduler.step_token_budget} tokens (the chunk beside decodes)"
                 if self.scheduler.chunked_prefill else "a prompt within the prefill token budget")
        steps = "step" if self.config.lean_prefill else "decode step"
        return True, f"on: {chunk} arriving during a {steps} is prefilled between its layers"

    def has_unfinished(self) -> bool:
        return bool(self._seqs) or bool(self._pending_outputs)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Offline helper (colocated role): run the prompts to completion, return each one's completion token ids."""
        if self.config.role is not Role.COLOCATED:
            raise ValueError("generate needs a colocated engine")
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        ids = [f"generate-{next(self._generate_ids)}" for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, params_list):
            self.add_request(request_id, prompt, p)
        results: dict[str, list[int]] = {request_id: [] for request_id in ids}
        remaining = set(ids)
        while remaining:
            for out in self.step():
                if out.request_id in results:
                    results[out.request_id] += out.new_token_ids
                    if out.finished:
                        remaining.discard(out.request_id)
        return [results[request_id] for request_id in ids]

    def stats(self) -> dict:
        bm, sched = self.block_manager, self.scheduler
        return {"num_running": len(sched.running), "num_waiting": len(sched.waiting), "kv_usage": bm.usage,
                "batch_limit": sched.seq_limit, "decode_step_fit": sched.step_times.last_fit,
                "num_prefill_tokens_computed": sched.num_prefill_tokens_computed,
                "num_generation_tokens": sched.num_generation_tokens, "num_preemptions": sched.num_preemptions,
                "num_kv_blocks_total": bm.num_blocks, "num_kv_blocks_used": bm.num_used_blocks,
                **self.prefix_cache_stats(),
                **(self.speculator.stats() if self.speculator is not None else {})}

    def prefix_cache_stats(self) -> dict:
        """Prefix caching, since start: prompt tokens looked up at admission, those found cached (prefill they
        skipped), and the blocks keyed now (in use or evictable). Zeros where prefix caching is off."""
        cache = self.block_manager.prefix_cache
        return {"prefix_cache_queried_tokens": cache.num_queried_tokens if cache else 0,
                "prefix_cache_hit_tokens": cache.num_hit_tokens if cache else 0,
                "prefix_cache_blocks": self.block_manager.num_cached_blocks}

    # -- validation at the edge -----------------------------------------------------------------------------------

    def _new_sequence(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      num_resumed_tokens: int = 0) -> Sequence:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if request_id in self._seqs:
            raise ValueError(f"request_id {request_id!r} is already in the engine")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        if not isinstance(prompt_token_ids, (list, tuple)) or not prompt_token_ids:
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        for token_id in prompt_token_ids:
            self._check_token_id(token_id, "prompt_token_ids")
        for token_id, _ in params.logit_bias:
            self._check_token_id(token_id, "logit_bias")
        num_prompt_tokens = len(prompt_token_ids)
        if not isinstance(num_resumed_tokens, int) or not 0 <= num_resumed_tokens < num_prompt_tokens:
            raise ValueError(f"num_resumed_tokens must be in [0, {num_prompt_tokens}), got {num_resumed_tokens!r}")
        # max_model_len is at most what the pool holds, so a sequence that passes fits the whole pool at its longest
        # (else it would wait, or be preempted, forever).
        if num_prompt_tokens + params.max_tokens > self.max_model_len:
            pool = (f", all that its KV pool of {self.block_manager.num_blocks} blocks holds"
                    if self.max_model_len < self.configured_max_model_len else "")
            raise ValueError(f"prompt_tokens ({num_prompt_tokens}) + max_tokens ({params.max_tokens}) = "
                             f"{num_prompt_tokens + params.max_tokens} exceeds max_model_len ({self.max_model_len}"
                             f"{pool})")
        return Sequence(request_id, list(prompt_token_ids), params, num_resumed_tokens)

    def _check_token_id(self, token_id: object, name: str) -> None:
        vocab_size = self.model_runner.vocab_size
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got {token_id!r}")
