"""Tandem's paged decode-attention kernel (paged_attention.c) for the decode rows of CPU steps, and when it runs.

torch's decode attention (attention.DecodeAttention) gathers every sequence's K/V blocks into a padded contiguous
copy per layer, then runs SDPA under a mask over the padding: at long contexts the copy costs more than the
attention, several times what reading those K/V once takes (docs/performance.md, "Decode attention at the memory's
rate").
The kernel reads each K and V row in place, once, through the block tables, as llama.cpp reads its cache.

It runs float32 and bfloat16 queries over float32, bfloat16 and float16 caches (a cache may be narrower than the
model's activations: Config.kv_cache_dtype) on a CPU with AVX-512F or AVX2+FMA (float16 caches: and F16C) and a C
build (build.py: at install, else on first use), for head dims that are a multiple of 16, wherever the decode forward
is eager: a ctypes call cannot be traced into a torch.compile graph, so a compiled engine keeps torch's attention.
The `matvec` setting covers it with the linears: "torch" is torch's ops for both, "auto" / "tandem" Tandem's kernels
where they run. Values are not
bit-identical to SDPA's (sums in another order; within float32 rounding, one bfloat16 rounding of the output), greedy
tokens are (tests/inference/engine/test_paged_attention.py).
"""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from inference.engine.kernels.build import KernelLibrary, load_library
from inference.hardware import cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention.c")
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # the queries' and outputs' (the model's compute dtype)
KV_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the cache's (kernels.h)


class Library(KernelLibrary):
    """The loaded kernel: `isa` is what it runs on this CPU (avx512f, avx2+fma)."""

    def __init__(self, lib: ctypes.CDLL):
        super().__init__(lib, "tandem_paged_attention")
        lib.tandem_paged_attention.restype = ctypes.c_int
        lib.tandem_paged_attention.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,  # dtype kv_dtype q out k
            ctypes.c_void_p,  # v
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,  # block tables, their row stride, context lengths
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,  # B Hq Hkv D bs
            ctypes.c_float, ctypes.c_int]  # scale, threads


@functools.lru_cache(maxsize=1)
def load() -> tuple[Library | None, str | None]:
    """(the library, None) or (None, why it cannot run here). Built at install, else on first use (build.py)."""
    return load_library(SOURCE, Library, "paged attention kernel")


def choose_decode_attention(setting: str, *, dtype: torch.dtype, device: torch.device, head_dim: int,
                            compiled: bool, kv_dtype: torch.dtype | None = None) -> tuple[Library | None, str]:
    """(the library, or None for torch's gather and SDPA; the reason, for /info and the log) for Config.matvec;
    `kv_dtype`: the cache's, when narrower than `dtype`."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if setting == "torch":
        return None, "torch: asked for (matvec torch)"
    if device.type != "cpu":
        return None, f"{setting}: torch's SDPA on {device.type} (the kernel is for CPUs)"
    if compiled:
        return None, f"{setting}: torch's SDPA inside the compiled decode step (a C call cannot be traced)"
    if dtype not in _DTYPE_CODES:
        return None, f"{setting}: the kernel runs float32 and bfloat16, not {str(dtype).removeprefix('torch.')}"
    if kv_dtype not in KV_DTYPE_CODES:
        return None, f"{setting}: the kernel reads float32, bfloat16 and float16 caches, not {kv_dtype}"
    if head_dim % 16:
        return None, f"{setting}: the kernel runs head dims that are a multiple of 16, not {head_dim}"
    library, reason = load()
    if library is not None and kv_dtype == torch.float16 and library.isa == "avx2+fma" and "f16c" not in cpu_flags():
        library, reason = None, "a float16 cache needs F16C, which this CPU has not got"
    if library is None:
        if setting == "tandem":
            log.warning("decode attention: torch's SDPA instead of the asked-for kernel: %s", reason)
        return None, f"{setting}: torch's SDPA: {reason}"
    return library, (f"{setting}: Tandem's paged kernel ({library.isa}): K/V read in place from the cache "
                     "(values not bit-identical to torch's SDPA, greedy tokens identical)")


class PagedDecode:
    """The kernel bound to one decode step: its block tables and context lengths, made once per step and read by
    every layer's call."""

    def __init__(self, library: Library, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, num_threads: int):
        # k_cache, v_cache: [L, N, bs, Hkv, D]; block_tables: [B, M] int64; context_lens: [B] int64
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype in KV_DTYPE_CODES
        assert block_tables.dtype == context_lens.dtype == torch.int64 and block_tables.stride(1) == 1
        assert context_lens.is_contiguous()
        self.lib, self.num_threads = library.lib, num_threads
        self.k_cache, self.v_cache = k_cache, v_cache
        self.block_tables, self.context_lens = block_tables, context_lens  # kept alive: the kernel reads them
        self.kv_code = KV_DTYPE_CODES[k_cache.dtype]
        _, _, self.block_size, self.num_kv_heads, self.head_dim = k_cache.shape
        self.layer_bytes = k_cache.stride(0) * k_cache.element_size()

    def __call__(self, layer_id: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        # q: [B, Hq, D] (this layer's K/V already in the cache)  ->  [B, Hq, D]
        q = q.contiguous()
        num_seqs, num_heads, head_dim = q.shape
        out = torch.empty_like(q)
        offset = layer_id * self.layer_bytes
        status = self.lib.tandem_paged_attention(
            _DTYPE_CODES[q.dtype], self.kv_code, q.data_ptr(), out.data_ptr(), self.k_cache.data_ptr() + offset,
            self.v_cache.data_ptr() + offset, self.block_tables.data_ptr(), self.block_tables.stride(0),
            self.context_lens.data_ptr(), num_seqs, num_heads, self.num_kv_heads, head_dim, self.block_size, scale,
            self.num_threads)
        if status:
            raise MemoryError(f"paged attention: no memory for the scores of a {num_seqs}-sequence step ({status})")
        return out
