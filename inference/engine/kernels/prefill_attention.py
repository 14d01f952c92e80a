"""Tandem's prefill-attention kernel (prefill_attention.c) for the prefill chunks of CPU steps, and when it runs.

torch's CPU path (attention.PrefillAttention) runs SDPA's flash kernel per chunk: causal over a chunk's own K/V, and
for a chunk after a cached prefix the prefix's rows gathered from the cache into a copy, under an explicit mask that
makes it compute every block of the chunk against every key (the masked part too). Its bfloat16 attention runs no
faster than its float32 (docs/performance.md, 'Prefill attention in a kernel of its own'). The
kernel reads the K/V rows in place (the chunk's own from the step's tensors, the prefix's from the cache), skips the
blocks no query of a tile can see, and runs bfloat16 on the AVX512-BF16 dot product.

It runs float32 where the CPU has AVX-512F (tiles of 16 queries, of 32 in two vectors for chunks of more than 16) or
AVX2 with FMA (tiles of 8, of 16 in two vectors above 8), and bfloat16 where it has AVX512-BF16 with AVX512BW, over a
cache of the model's dtype (over a narrower one, Config.kv_cache_dtype, for whole prompts only: a chunk after a cached
prefix keeps torch's path, which widens the rows it gathers), for head dims that are a multiple of 16 up to 256, and the
`matvec` setting is not "torch" (it covers Tandem's kernels); elsewhere (bfloat16 without AVX512-BF16, where SDPA's is
no slower than float32's anyway; bfloat16 on a CPU with AMX, where SDPA's flash kernel multiplies on AMX several times
faster than the kernel does, unless `matvec` is "tandem"; CUDA) torch's SDPA. Values are not
bit-identical to SDPA's (sums in another order; bfloat16: the probabilities rounded as torch's flash kernel rounds
them), greedy tokens are (tests/inference/engine/test_prefill_attention.py).
"""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from inference.engine.kernels.build import load
from inference.hardware import cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("prefill_attention.c")
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
ISA_NAMES = {1: "avx2+fma", 2: "avx512f", 3: "avx512f+avx512_bf16"}  # what tandem_prefill_attention_isa() says


class Library:
    """The loaded kernel: `isa` says what it runs on this CPU (float32 on avx2+fma and avx512f; bfloat16 too on
    avx512f+avx512_bf16), None for none of them."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.tandem_prefill_attention_isa.restype = lib.tandem_prefill_attention_cap_isa.restype = ctypes.c_int
        lib.tandem_prefill_attention_cap_isa.argtypes = [ctypes.c_int]
        lib.tandem_prefill_attention.restype = ctypes.c_int
        lib.tandem_prefill_attention.argtypes = [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,  # dtype q ld_q out ld_o
            ctypes.c_int64, ctypes.c_int64,  # C first
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,  # k ld_k v ld_v slots
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int]  # Hq Hkv D scale threads
        self.isa = ISA_NAMES.get(lib.tandem_prefill_attention_isa())

    def runs(self, dtype: torch.dtype) -> bool:
        return self.isa is not None and (dtype == torch.float32 or (dtype == torch.bfloat16 and "bf16" in self.isa))

    def cap_isa(self, name: str | None) -> str | None:
        """Run no wider set than `name` (avx2+fma, avx512f: float32 only) from now on, in this process."""
        codes = {v: k for k, v in ISA_NAMES.items()}
        self.isa = ISA_NAMES.get(self.lib.tandem_prefill_attention_cap_isa(codes.get(name, 0)))
        return self.isa

    def attend(self, q: torch.Tensor, first: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
               scale: float, num_threads: int, out: torch.Tensor) -> torch.Tensor:
        """Causal attention of the C queries `q` [C, Hq, D] at positions first .. first + C - 1 over key positions
        0 .. first + C - 1, whose rows are `keys[slots[j]]` and `values[slots[j]]` (keys, values: [N, Hkv, D] of q's
        dtype, each position's heads contiguous; slots: [first + C] int64) into `out` [C, Hq, D] (likewise)."""
        num_queries, num_heads, head_dim = q.shape
        # each position's heads one after another (any row stride: the engine's are views of a fused projection)
        q, keys, values = (t if t.stride(2) == 1 and t.stride(1) == head_dim else t.contiguous()
                           for t in (q, keys, values))
        assert out.stride(2) == 1 and out.stride(1) == head_dim
        assert keys.dtype == values.dtype == out.dtype == q.dtype
        assert slots.dtype == torch.int64 and slots.is_contiguous() and slots.numel() == first + num_queries
        status = self.lib.tandem_prefill_attention(
            _DTYPE_CODES[q.dtype], q.data_ptr(), q.stride(0), out.data_ptr(), out.stride(0), num_queries, first,
            keys.data_ptr(), keys.stride(0), values.data_ptr(), values.stride(0), slots.data_ptr(), num_heads,
            keys.shape[1], head_dim, scale, num_threads)
        if status == -2:
            raise MemoryError(f"prefill attention: no memory for {num_queries} queries at position {first}")
        if status:  # -1: no instruction set for the dtype, -3: a shape the kernel does not take (choose_... checks)
            raise ValueError(f"prefill attention: status {status} for q {tuple(q.shape)} {q.dtype}")
        return out


@functools.lru_cache(maxsize=1)
def load_kernel() -> tuple[Library | None, str | None]:
    """(the library, None) or (None, why it cannot run here). Built at install, else on first use (build.py)."""
    lib, reason = load(SOURCE)
    if lib is None:
        return None, reason
    library = Library(lib)
    if library.isa is None:
        return None, "this CPU has neither AVX-512F nor AVX2 with FMA, which the prefill-attention kernel needs"
    return library, None


def choose_prefill_attention(setting: str, *, dtype: torch.dtype, device: torch.device, head_dim: int,
                             kv_dtype: torch.dtype | None = None) -> tuple[Library | None, str]:
    """(the library, or None for torch's SDPA; the reason, for /info and the log) for Config.matvec; `kv_dtype`:
    the cache's, when narrower than `dtype`."""
    if setting == "torch":
        return None, "torch: asked for (matvec torch)"
    if device.type != "cpu":
        return None, f"{setting}: torch's SDPA on {device.type} (the kernel is for CPUs)"
    if dtype not in _DTYPE_CODES:
        return None, f"{setting}: the kernel runs float32 and bfloat16, not {str(dtype).removeprefix('torch.')}"
    if head_dim % 16 or head_dim > 256:
        return None, f"{setting}: the kernel runs head dims that are a multiple of 16 up to 256, not {head_dim}"
    library, reason = load_kernel()
    if library is not None and not library.runs(dtype):
        library, reason = None, "bfloat16 needs AVX512-BF16 and AVX512BW, which this CPU has not got"
    if library is None:
        if setting == "tandem":
            log.warning("prefill attention: torch's SDPA instead of the asked-for kernel: %s", reason)
        return None, f"{setting}: torch's SDPA: {reason}"
    if dtype == torch.bfloat16 and setting == "auto" and "amx_bf16" in cpu_flags():
        return None, ("auto: torch's SDPA: its bfloat16 flash attention runs on AMX here, ~2-3x the kernel's "
                      "AVX512-BF16 (matvec tandem runs the kernel)")
    narrow = kv_dtype is not None and kv_dtype != dtype
    return library, (f"{setting}: Tandem's prefill kernel ({library.isa}): K/V read in place, causal blocks skipped "
                     "(values not bit-identical to torch's SDPA)" + (
                         f"; over the {str(kv_dtype).removeprefix('torch.')} cache for whole prompts only (a chunk "
                         "after a cached prefix keeps SDPA)" if narrow else ""))
