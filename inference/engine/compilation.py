"""`compile`: the decode step's forward through torch.compile, warmed up while the engine is built.

What is compiled is the runner's reference forward (reference_forward.py) for decode-only steps (one token per
sequence), the step that runs once per generated token, where per-op overhead weighs most: inductor on a CPU (its C++
kernels fuse the elementwise ops between the matmuls), CUDA graphs on CUDA (`mode="reduce-overhead"`: one launch replays
the whole step). Prefill and mixed chunked steps stay eager: they are compute-bound (one large matmul per projection)
and their shapes differ at every step; a prefill engine compiles nothing. Off by default: on a CPU the matmuls dominate
a SmolLM2 decode step and the compiled step measured slower than eager (bench/engine/stage_limits.py, `levers`).

Shapes: a decode step's tensors are sized by the batch (B) and the blocks of its longest context (M). torch.compile
specializes the first shapes it sees and recompiles once a dimension changes, with that dimension dynamic (and
sizes 1 apart), so the warm-up runs the four kinds (B = 1 or more, M = 1 or more) before the worker reports ready.
On CUDA each distinct shape records a CUDA graph of its own on first use (a stall of the step that meets it), so
there tables are padded to a power of two of blocks (`pad_num_table_blocks`) and the batch to a bucket
(`padded_batch_size`: 1, 2, 4, 8, then multiples of 8, as vLLM captures), the padding rows writing into a scratch
KV block no sequence is given: the shapes are bounded by the buckets x log2 of the context, not by every batch size
a server meets as requests come and go.

Inductor on a CPU needs a C++ compiler. Where there is none (or compilation fails for any reason) the engine runs
eager, logs one line, and `compile_info["fallback"]` says why.
"""
from __future__ import annotations

import logging
import time

import torch

from inference.engine.attention import DecodeAttention
from inference.roles import Role

log = logging.getLogger(__name__)


@torch.library.custom_op("tandem::write_kv", mutates_args=("k_cache", "v_cache"))
def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, layer_id: int, slot_mapping: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """One layer's K/V of this step into their cache slots, as one op that the compiled graph mutates in place.
    Traced as plain indexing into the pool, the in-place write to a view of a graph input becomes a copy of the
    whole pool per layer, which makes a step many times slower, the more so the larger the pool."""
    # k_cache, v_cache: [L, N, bs, Hkv, D]; slot_mapping: [T]; k, v: [T, Hkv, D]
    num_layers, _, _, num_kv_heads, head_dim = k_cache.shape
    k_cache.view(num_layers, -1, num_kv_heads, head_dim)[layer_id].index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(num_layers, -1, num_kv_heads, head_dim)[layer_id].index_copy_(0, slot_mapping, v.to(v_cache.dtype))


@write_kv.register_fake
def _(k_cache, v_cache, layer_id, slot_mapping, k, v) -> None:
    return None


# (batch, table blocks) of the warm-up decode steps: both at 1, both above 1, and each alone above 1.
WARM_UP_SHAPES = ((1, 1), (2, 2), (3, 3), (1, 2), (2, 1))


def backend_for(device: torch.device) -> tuple[str, str | None]:
    """(backend, mode) torch.compile is asked for on this device."""
    if device.type == "cuda":
        return "inductor", "reduce-overhead"
    return "inductor", None


def missing_requirement(device: torch.device) -> str | None:
    """Why inductor cannot compile here, or None. On a CPU it builds C++ kernels: it needs a C++ compiler."""
    if device.type != "cpu":
        return None
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return "no C++ compiler found (inductor builds C++ kernels on a CPU; install g++ or set CXX)"
    return None


def pad_num_table_blocks(num_blocks: int, device: torch.device, enabled: bool) -> int:
    """The table width of a decode step: as is, or on CUDA with compile a power of two (fewer CUDA graphs)."""
    if not enabled or device.type != "cuda":
        return num_blocks
    return 1 << (num_blocks - 1).bit_length()


def pads_decode_batch(config, device: torch.device) -> bool:
    """Whether a compiled decode step's batch is padded to a bucket: on CUDA (CUDA graphs), not on a CPU (inductor's
    dynamic shapes need no recording per size), nor on a prefill engine (it compiles nothing)."""
    return bool(config.compile) and device.type == "cuda" and config.role is not Role.PREFILL


def padded_batch_size(num_seqs: int) -> int:
    """The bucket a decode batch is padded to: 1, 2, 4, 8, then the next multiple of 8."""
    if num_seqs <= 8:
        return 1 << (num_seqs - 1).bit_length()
    return -(-num_seqs // 8) * 8


def compile_decode(forward, pool) -> tuple[object | None, dict]:
    """(`forward` compiled, or None; compile_info) for the decode steps over `pool` (kv_pool.KVPool). Runs the
    warm-up steps: their cost is warmup_s."""
    device = pool.device
    backend, mode = backend_for(device)
    info = {"enabled": False, "backend": backend, "mode": mode, "warmup_s": 0.0, "fallback": None,
            "num_warmup_steps": 0, "pads_batch": False}
    reason = missing_requirement(device)
    if reason is None:
        if device.type == "cuda":
            # The KV pool is written in place by every step: CUDA graphs replay only over inputs at fixed addresses.
            torch._dynamo.mark_static_address(pool.k_cache)
            torch._dynamo.mark_static_address(pool.v_cache)
        compiled = torch.compile(forward, backend=backend, mode=mode)
        start = time.perf_counter()
        try:
            for num_seqs, num_table_blocks in WARM_UP_SHAPES:
                warm_up_step(pool, compiled, num_seqs, num_table_blocks)
                info["num_warmup_steps"] += 1
        except Exception as exc:  # noqa: BLE001 - any failure to compile means: run eager, and say why
            reason = f"compilation failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        finally:
            pool.clear_block(0)
        info["warmup_s"] = round(time.perf_counter() - start, 2)
        if reason is None:
            info["enabled"] = True
            info["pads_batch"] = pool.scratch_block is not None
            log.info("compile: decode step compiled (%s%s) in %.1f s of warm-up", backend,
                     f", {mode}" if mode else "", info["warmup_s"])
            return compiled, info
    info["fallback"] = reason
    log.warning("compile: running eager: %s", reason)
    return None, info


@torch.inference_mode()
def warm_up_step(pool, forward, num_seqs: int, num_table_blocks: int) -> None:
    """One decode step of `num_seqs` dummy sequences over `num_table_blocks` blocks, all in block 0 (which the
    caller zeroes after)."""
    device = pool.device
    # Three tensors, not one: the compiled graph guards on its inputs not aliasing each other.
    input_ids, positions, slot_mapping = (torch.zeros(num_seqs, dtype=torch.long, device=device) for _ in range(3))
    tables = torch.zeros(num_seqs, num_table_blocks, dtype=torch.long, device=device)  # [B, M]
    mask = torch.ones(num_seqs, 1, 1, num_table_blocks * pool.block_size, dtype=torch.bool, device=device)
    attention = DecodeAttention(pool.k_cache, pool.v_cache, tables, mask)
    forward(input_ids, positions, slot_mapping, attention)  # [B] each
    if device.type == "cuda":
        # CUDA graphs record on a later call than the first (which warms up the kernels): replay once more.
        forward(input_ids, positions, slot_mapping, attention)
        torch.cuda.synchronize(device)
