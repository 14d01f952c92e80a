"""The engine settings a revision may set, declared once: each one's kind, default, bounds and meaning.

From this table the worker builds its flags (inference/worker/config.py: `--block-size`, `--no-chunked-prefill`,
...), the control plane checks a revision's `engine_settings` (controlplane/services/validation.py) and the node agent
turns them back into flags (controlplane/agent/launch.py). The engine's `Config` holds each one as a field of the same
name and default (a test keeps the two equal) and checks its own values. Settings with a shape of their own
(device, dtype, speculative, shared_prompt, simulate) are checked by their owners and are not in the table.

Adding a setting: a row here, a field in Config (or WorkerConfig for the worker's own), and the code that uses it.
"""
from __future__ import annotations

from dataclasses import dataclass

from inference.engine.config import KV_CACHE_DTYPES, MATVECS, QUANTIZATIONS, WEIGHT_LAYOUTS

# The largest KV pool one worker may ask for: 4 TiB is beyond any single host; past it a value is a typo.
MAX_KV_CACHE_BYTES = 4 << 40
# Token counts: past this a value is a typo, not a model.
MAX_TOKENS = 1 << 24


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    # int: an integer in [low, high] (or None where default is None: the engine chooses); bytes: an integer of bytes
    # in [low, high], or "auto" (the flag also takes 64M, 1GiB); bool: true or false; fraction: a number in
    # (low, high]; choice: one of `choices`.
    kind: str
    help: str
    default: object = None
    low: float = 1
    high: float = MAX_TOKENS
    choices: tuple[str, ...] = ()


ENGINE_SETTINGS = (
    Setting("quantization", "choice", "none, or int8: linear layers and embeddings in int8 with per-channel scales "
            "(about a quarter of the float32 weight memory; outputs not bit-identical)",
            default="none", choices=QUANTIZATIONS),
    Setting("weight_layout", "choice", "how the float linears' weights lie in memory: auto (transposed for float32 "
            "on a CPU, where one-token matmuls read them faster; as loaded elsewhere), as_loaded, or transposed "
            "(greedy tokens identical, values not bit-identical)", default="auto", choices=WEIGHT_LAYOUTS),
    Setting("matvec", "choice", "the kernel of the float linears in decode steps on a CPU: auto (Tandem's kernel "
            "where it runs, float32 or bfloat16 with AVX2+FMA or AVX-512F; torch's matmul elsewhere), tandem, or "
            "torch (greedy tokens identical, values not bit-identical); the same for the decode rows' attention "
            "(Tandem's paged kernel or torch's SDPA); INT8 linears: Tandem's int8 kernel (auto: on a decode worker "
            "or a CPU without VNNI) or fbgemm", default="auto", choices=MATVECS),
    Setting("packed_weights", "bool", "CPU steps of more tokens than the matvec kernel takes (prefill chunks, "
            "large decode batches) run oneDNN's GEMM over a copy of the float weights packed once at start: faster "
            "steps, but the float weights held twice (weight_bytes on /info counts both); greedy tokens identical, "
            "values not bit-identical", default=False),
    Setting("kv_cache_dtype", "choice", "the KV cache's dtype: auto (the model's), or float16 or bfloat16 beside a "
            "float32 model (half the bytes per token, each value rounded once; outputs not bit-identical)",
            default="auto", choices=KV_CACHE_DTYPES),
    Setting("allow_slow_float16", "bool", "run dtype float16 even on a CPU without fast float16 (refused "
            "otherwise: it crawls)", default=False),
    Setting("threads", "int", "torch intra-op threads", high=1024),
    Setting("kv_cache_bytes", "bytes", "KV pool size, e.g. 64M, or auto: kv_memory_fraction of the memory free "
            "after the weights load, at least one full context where memory allows, at most max_num_seqs of them",
            default="auto", high=MAX_KV_CACHE_BYTES),
    Setting("kv_memory_fraction", "fraction", "for kv_cache_bytes auto: the share of free memory for the KV pool "
            "(default 0.2 of available RAM on CPU, 0.8 of free GPU memory on CUDA)", low=0, high=1),
    Setting("block_size", "int", "tokens per KV block", default=16, high=1024),
    Setting("max_num_seqs", "int", "largest running batch", default=64, high=65_536),
    Setting("max_num_batched_tokens", "int", "prefill token budget per step", default=2048),
    Setting("chunked_prefill", "bool", "prefill long prompts in chunks, interleaved with running decodes "
            "(colocated) and with other prompts, shortest first (prefill); on by default", default=True),
    Setting("interleave_prefill", "bool", "colocated: prefill a request that arrives during a decode step between "
            "that step's layers, so that its first token does not wait for the step's end (with chunked prefill: a "
            "prompt that fits prefill_chunk_size); on by default", default=True),
    Setting("prefill_chunk_size", "int", "with chunked prefill: the most tokens one step feeds (decodes and prefill "
            "chunks together) beside running decodes, at most max_num_batched_tokens (default: 64 on a CPU, 512 on "
            "CUDA)"),
    Setting("prefill_chunk_size_alone", "int", "with chunked prefill: the most tokens a step without decodes feeds "
            "(every step of a prefill worker, a colocated one's while no stream is past its prefill), at least "
            "prefill_chunk_size (default: 4 x prefill_chunk_size)"),
    Setting("prefix_caching", "bool", "keep full KV blocks keyed by their prefix after a request ends, so that "
            "later requests sharing it compute only the rest (colocated and prefill; a decode worker has no use "
            "for it); on by default", default=True),
    Setting("max_model_len", "int", "the longest context a request may have (default: from the model config)"),
    Setting("compile", "bool", "torch.compile the decode step (inductor on a CPU, which needs a C++ compiler, else "
            "eager with the reason on /info; CUDA graphs on CUDA), warmed up before the worker is ready",
            default=False),
    # The worker's own (WorkerConfig), not the engine's.
    Setting("max_queue", "int", "requests admitted beyond max_num_seqs before answering 429", default=256,
            high=1 << 20),
)
BY_NAME = {setting.name: setting for setting in ENGINE_SETTINGS}


def check(setting: Setting, value) -> str | None:
    """None where `value` is a good value of `setting`, else what it must be (to follow the setting's name)."""
    if setting.kind == "choice":
        return None if value in setting.choices else f"must be one of {', '.join(setting.choices)}"
    if setting.kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if setting.kind == "fraction":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and setting.low < value <= setting.high else \
            f"must be a number above {setting.low:g} and at most {setting.high:g}"
    if setting.kind == "bytes" and value == "auto":
        return None
    # bool is an int in Python; true is never a meant number of anything.
    if isinstance(value, bool) or not isinstance(value, int) or not setting.low <= value <= setting.high:
        either = " or auto" if setting.kind == "bytes" else ""
        return f"must be a positive integer{either} (at most {setting.high})"
    return None
