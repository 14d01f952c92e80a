"""The real worker's engine: `inference.engine.LLMEngine` on its own thread (engine_loop.py), its tokenizer, and the
KV wire format with torch tensors (inference.kv_wire). torch and transformers load on the engine thread, while
/health answers "starting"; nothing here imports them at module level.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

from inference.engine.config import QUANTIZATION_NOTES
from inference.engine.kernels.build import status as kernel_status
from inference.metrics import TandemMetrics
from inference.model_snapshot import check_unchanged, snapshot
from inference.roofline import StageRoofline, count_parameters, precision_key
from inference.worker.config import WorkerConfig
from inference.worker.engine_loop import EngineLoop
from inference.worker.engine_request import EngineRequest, LoopState
from inference.worker.protocol import RequestError

log = logging.getLogger(__name__)

# Bytes of a KV payload beyond its tensors: the JSON header (prompt ids as decimal text) and safetensors framing.
HEADER_BYTES_PER_TOKEN = 16
HEADER_SLACK_BYTES = 1 << 20
KV_HEADER_FIELDS = ("request_id", "prompt_token_ids", "first_token_id", "sampling", "kv_layout", "revision")
# A prompt this short tokenizes in well under a millisecond: on the event loop it skips the two thread hops of the
# tokenizer thread (that thread waking, then the loop waking to its answer), which cost far more on a worker serving
# several streams (docs/performance.md, "A quiet request's path, traced"). Longer prompts, and any while the tokenizer
# thread is busy, go to that thread, so that a megabyte prompt never holds the loop.
INLINE_TOKENIZE_CHARS = 2000
INLINE_TOKENIZE_MESSAGES = 8


def kv_body_limit(info: dict) -> int:
    """The largest payload a request that fits this model can need: a bigger body is refused before it is read.

    Counted at 4 bytes an element whatever this worker's dtype, so that a payload from a prefill worker of a wider
    dtype reaches the header check and its 400 that names both dtypes, not a bare 413."""
    layout = info["kv_layout"]
    itemsize = 4  # the widest dtype a worker runs (float32)
    per_token = 2 * layout["num_layers"] * layout["num_kv_heads"] * layout["head_dim"] * itemsize
    return info["max_model_len"] * (per_token + HEADER_BYTES_PER_TOKEN) + HEADER_SLACK_BYTES


def max_token_chars(tokenizer) -> int:
    """An upper bound on the characters one token stands for: its vocabulary spelling's length (byte-level BPE
    spells each byte as one character, SentencePiece's byte fallback as `<0xNN>`, special tokens as their text)."""
    return max(len(token) for token in tokenizer.get_vocab())


class WireKV:
    """inference.kv_wire: safetensors of the real K/V, (de)serialized in a thread (torch work)."""

    def body_limit(self, info: dict) -> int:
        return kv_body_limit(info)

    async def encode(self, header: dict, kv: tuple) -> bytes:
        from inference.kv_wire import KVPayload, encode_payload

        payload = KVPayload(**{name: header[name] for name in KV_HEADER_FIELDS}, k=kv[0], v=kv[1],
                            extra={k: v for k, v in header.items() if k not in KV_HEADER_FIELDS})
        return await asyncio.get_running_loop().run_in_executor(None, encode_payload, payload)

    async def decode(self, body: bytes, *, kv_layout: dict, revision: str | None) -> tuple[dict, tuple]:
        from inference.kv_wire import decode_payload

        payload = await asyncio.get_running_loop().run_in_executor(None, partial(
            decode_payload, body, kv_layout=kv_layout, revision=revision))  # KVWireError is a ValueError
        return payload.header(), (payload.k, payload.v)


class ModelEngine:
    """The WorkerEngine (seams.py) of a real worker."""

    simulated = False

    def __init__(self, config: WorkerConfig, metrics: TandemMetrics):
        self.config = config
        self.metrics = metrics
        self.loop = EngineLoop(self._make_engine, metrics, role=config.engine.role)
        if config.engine.compile:  # said on /health's 503 while it lasts: minutes on CUDA (TANDEM_WARMUP_TIMEOUT_S)
            self.loop.reason = "loading the model, then compiling its decode step (torch.compile warm-up)"
        self.kv = WireKV()
        self.vocab_size = 0
        self.tokenizer = None
        # One thread for the tokenizer, and a lock that a short prompt tokenized on the loop takes only when free, so
        # that no two calls race inside the Rust tokenizer.
        self._tokenize_executor = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        self._tokenizer_lock = threading.Lock()

    def _make_engine(self):
        from inference.engine import LLMEngine  # torch: on the engine thread, while /health answers "starting"

        engine_config = self.config.engine
        if self.config.model_snapshots:
            reason, self.loop.reason = self.loop.reason, "copying the model folder to a private snapshot"
            engine_config = replace(engine_config, model=str(snapshot(engine_config.model, self.config.model_snapshots,
                                                                      expected=self.config.model_checksum)))
            self.loop.reason = reason
        elif self.config.model_checksum:
            check_unchanged(engine_config.model, self.config.model_checksum)
        engine = LLMEngine(engine_config)
        self.loop.roofline = self._stage_roofline(engine)
        return engine

    def _stage_roofline(self, engine) -> StageRoofline | None:
        """The worker's stages against the host's figures its node agent passed (none passed: no efficiency)."""
        config = self.config
        if config.host_peak_gflops is None and config.host_bandwidth_gbs is None:
            return None
        precision = precision_key(engine.dtype, engine.quantization, engine.model_runner.int8_kernel)
        return StageRoofline(num_parameters=count_parameters(config.engine.model), weight_bytes=engine.weight_bytes,
                             peak_gflops=(config.host_peak_gflops or {}).get(precision),
                             read_gbs=config.host_bandwidth_gbs, precision=precision)

    # -- what the server reads of the loop ---------------------------------------------------------------------------

    @property
    def state(self) -> LoopState:
        return self.loop.state

    @property
    def reason(self) -> str:
        return self.loop.reason

    @property
    def stats(self) -> dict:
        roofline = self.loop.roofline
        return {**self.loop.stats, "roofline": roofline.snapshot() if roofline is not None else None}

    def is_alive(self) -> bool:
        return self.loop.is_alive()

    def seconds_since_heartbeat(self) -> float:
        return self.loop.seconds_since_heartbeat()

    def submit(self, request: EngineRequest) -> None:
        self.loop.submit(request)

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    # -- life ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop(timeout=10.0 if self.loop.loaded.is_set() else 0.1)
        self._tokenize_executor.shutdown(wait=False)

    async def wait_loaded(self) -> dict | None:
        """Wait for the engine thread to finish loading; then publish what /info, /metrics and handlers need."""
        while not self.loop.loaded.is_set():
            await asyncio.sleep(0.05)
        engine = self.loop.engine
        if engine is None:
            log.error("%s", self.loop.reason)
            return None
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.model_runner.vocab_size
        config = self.config
        info = {"role": config.engine.role, "model": config.model_name,
                "model_path": str(Path(config.engine.model).resolve()), "revision": config.revision,
                "dtype": engine.dtype, "dtype_requested": config.engine.dtype, "dtype_reason": engine.dtype_reason,
                # The KV cache's dtype: the model's, or narrower (Config.kv_cache_dtype); the handoff's too.
                "kv_cache_dtype": engine.kv_cache_dtype, "kv_cache_dtype_reason": engine.kv_cache_dtype_reason,
                # max_model_len: the context a request can have here, at most what the KV pool holds.
                "max_model_len": engine.max_model_len,
                "configured_max_model_len": engine.configured_max_model_len,
                # The batch limits it runs with: a revision's per-role settings, as this worker got them.
                "max_num_seqs": config.engine.max_num_seqs,
                "max_num_batched_tokens": config.engine.max_num_batched_tokens,
                "kv_layout": dict(engine.kv_layout),
                "quantization": engine.quantization, "weight_bytes": engine.weight_bytes,
                "bit_identical": engine.quantization == "none",
                # What runs (off on a decode worker, whatever was asked): the gateway routes by prefix affinity to
                # workers that say true in /health.
                "prefix_caching": engine.prefix_caching,
                # Speculative decoding ({"method": ..., "num_tokens": ...} with its defaults) or None: off.
                "speculative": engine.speculative,
                # torch.compile of the decode step: {"enabled", "backend", "mode", "warmup_s", "fallback", ...}.
                "compile": engine.compile_info,
                # {"setting", "layout" (as_loaded or transposed), "reason"}: how the float weights lie in memory.
                "weight_layout": engine.weight_layout,
                "matvec": engine.matvec,
                # Each C kernel: built at install, compiled by a worker on first use (a development fallback), or
                # missing with the reason (torch's path runs instead); inference.engine.kernels.build.
                "kernels": kernel_status(),
                # Tensor ops (aten calls) of one single-stream decode step's eager forward and lm_head: the
                # per-step overhead that no bandwidth removes (None on a prefill worker, which runs no decode step).
                "decode_step_ops": engine.decode_step_ops,
                # Whether a request arriving during a decode step is prefilled between its layers, and why.
                "interleave_prefill": {"enabled": engine.interleave_prefill, "reason": engine.interleave_reason},
                # No prompt of more characters fits max_model_len tokens: the gateway refuses longer ones before
                # they reach this worker's one tokenizer thread.
                "max_prompt_chars": engine.max_model_len * max_token_chars(engine.tokenizer)}
        if engine.quantization in QUANTIZATION_NOTES:
            info["note"] = QUANTIZATION_NOTES[engine.quantization]
        self.metrics.set_worker_info(dtype=engine.dtype, dtype_requested=config.engine.dtype,
                                     revision=config.revision or "", quantization=engine.quantization)
        self.metrics.model_weight_bytes.set(engine.weight_bytes)
        self.metrics.set_kernels(info["kernels"])
        self.metrics.watch_devices([str(engine.model_runner.device)],
                                   visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        return info

    async def tokenize(self, prompt: str | None, messages: list[dict] | None) -> list[int]:
        tokenizer = self.tokenizer

        def run() -> list[int]:
            if messages is not None:
                if not getattr(tokenizer, "chat_template", None):
                    raise RequestError("this model has no chat template; send 'prompt' instead of 'messages'",
                                       param="messages")
                try:
                    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                except Exception as exc:  # templates raise on what they refuse (roles out of order, ...)
                    raise RequestError(f"the model's chat template refused the messages: {exc}",
                                       param="messages") from None
                # The template writes any BOS itself; adding special tokens again would double it.
                return tokenizer.encode(text, add_special_tokens=False)
            return tokenizer.encode(prompt)

        if _short(prompt, messages) and self._tokenizer_lock.acquire(blocking=False):
            try:
                return run()
            finally:
                self._tokenizer_lock.release()

        def on_thread() -> list[int]:
            with self._tokenizer_lock:
                return run()

        return await asyncio.get_running_loop().run_in_executor(self._tokenize_executor, on_thread)


def _short(prompt: str | None, messages: list[dict] | None) -> bool:
    """Whether the prompt is short enough to tokenize on the event loop (INLINE_TOKENIZE_CHARS)."""
    if prompt is not None:
        return len(prompt) <= INLINE_TOKENIZE_CHARS
    if messages is None or len(messages) > INLINE_TOKENIZE_MESSAGES:
        return False
    contents = [message.get("content") for message in messages]
    return (all(isinstance(content, str) for content in contents)
            and sum(map(len, contents)) <= INLINE_TOKENIZE_CHARS)
