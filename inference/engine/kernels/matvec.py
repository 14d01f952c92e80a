"""Tandem's matrix-vector kernel (matvec.c) for the linears of CPU decode steps, and the `matvec` setting's rule.

A single-stream decode step multiplies one token by every weight once: it is bound by how fast the weights stream
from memory. torch's one-token matmul (MKL's matrix-vector product over an [out, in] weight) reads them at about
half the rate one thread reads memory in a plain sum; matvec.c reads each row once, in order, at about that rate
(bench/engine/decode_kernels.py has each kernel; docs/performance.md the figures), and normalizes its input on the
way in where an RMSNorm comes first (lean_decode.normed_projection). It runs the float32 and bfloat16
linears of steps of at most `Library.max_tokens_for(dtype)` tokens (decode steps of up to that many sequences: 32,
in tiles of rows x 4 tokens above 4, which beat oneDNN's GEMM at batched decode; bfloat16 on a CPU with AVX512-BF16
runs every step in tiles of its bfloat16 dot product, and stops at 8 tokens where the CPU has AMX for oneDNN's
GEMM); longer steps (prefill, big batches) run a GEMM, which computes many tokens at once better than a loop over rows
(float32: oneDNN's, gemm.py; bfloat16: torch's, which is oneDNN's too).

The library is built from matvec.c at install (build.py; else on first use, which the worker reports) and loaded
with ctypes; the kernels pick AVX-512F or AVX2+FMA at run time. Where it cannot run
(no compiler, a CPU with neither instruction set, CUDA, another dtype, INT8 modules), the engine keeps torch's
matmul and says why (`matvec` on /info).
"""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.interleave import Pause
from inference.engine.kernels.build import KernelLibrary, load_library
from inference.hardware import cpu_flags, cpu_has_native_bfloat16

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("matvec.c")
# Steps of at most `Library.max_tokens_for(dtype)` tokens run the kernel: up to MAX_TOKENS the rows a token group at
# a time (bound by the weights' stream), above that tiles of rows x 4 tokens (bound by arithmetic), which beat
# oneDNN's GEMM in the engine up to WIDE_MAX_TOKENS tokens in float32 (bench/engine/batched_decode.py), with AVX2
# only and with AVX-512, by less the more tokens. In bfloat16 on a CPU with AMX, oneDNN's bfloat16 GEMM (AMX's) is
# faster than the AVX-512F tiles from about a dozen tokens: there the tiles stop at NATIVE_BFLOAT16_MAX_TOKENS (the
# AVX512-BF16 tiles have not been compared with AMX). With AVX512-BF16 and no AMX the AVX512-BF16 tiles beat oneDNN's
# bfloat16 GEMM up to WIDE_MAX_TOKENS (matvec_bf16dot.h). More tokens run a GEMM (gemm.py). The figures:
# docs/performance.md, 'Batched decode'.
MAX_TOKENS = 4
WIDE_MAX_TOKENS = 32
NATIVE_BFLOAT16_MAX_TOKENS = 8
# A step that may pause for an arrival (interleave.py) runs a wide projection in parts of at most PAUSE_ROWS output
# rows and looks at the arrivals flag between them: a small model's LM head (SmolLM2's: 49,152 x 576) is a sizeable
# share of a decode step of a few streams, which no layer boundary cut before.
# A multiple of the AVX-512 (6) and AVX2 (3) tiles; each output is computed as in one call.
PAUSE_ROWS = 8190
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


class Library(KernelLibrary):
    """The loaded kernel: `isa` is what it runs on this CPU (avx512f, avx2+fma)."""

    def __init__(self, lib: ctypes.CDLL):
        super().__init__(lib, "tandem_matvec")
        self.lib.tandem_matvec.restype = ctypes.c_int
        self.lib.tandem_matvec.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_float, ctypes.c_int]

        self.lib.tandem_matvec_bf16_dot.restype = ctypes.c_int
        self.lib.tandem_matvec_bf16_dot.argtypes = [ctypes.c_int]
        self.native_bfloat16 = cpu_has_native_bfloat16()
        self.amx = "amx_bf16" in cpu_flags()
        # Whether bfloat16 steps run the AVX512-BF16 tiles (the CPU has AVX512-BF16, the kernels run AVX-512): the C
        # library's state, read again only where it changes (here, use_bfloat16_tiles, cap_isa), not per projection.
        self.bfloat16_tiles = bool(self.lib.tandem_matvec_bf16_dot(-1))

    def use_bfloat16_tiles(self, on: bool) -> bool:
        """Turn the AVX512-BF16 tiles off (then bfloat16 runs the AVX-512F kernels, as on a CPU without them) or on
        again where they can run, in this process; returns whether they run now."""
        self.bfloat16_tiles = bool(self.lib.tandem_matvec_bf16_dot(1 if on else 0))
        return self.bfloat16_tiles

    def cap_isa(self, name: str) -> str | None:
        isa = super().cap_isa(name)
        self.bfloat16_tiles = bool(self.lib.tandem_matvec_bf16_dot(-1))  # none below AVX-512
        return isa

    def max_tokens_for(self, dtype: torch.dtype) -> int:
        """The most tokens of a step the kernel computes in `dtype` (more: a GEMM), by the instruction set it runs
        now."""
        if dtype == torch.bfloat16 and self.native_bfloat16 and self.isa == "avx512f" and (
                self.amx or not self.bfloat16_tiles):
            return NATIVE_BFLOAT16_MAX_TOKENS
        return WIDE_MAX_TOKENS

    @property
    def max_tokens(self) -> int:
        """max_tokens_for(float32)."""
        return self.max_tokens_for(torch.float32)


@functools.lru_cache(maxsize=1)
def load() -> tuple[Library | None, str | None]:
    """(the library, None) or (None, why it cannot run here). Built at install, else on first use (build.py)."""
    return load_library(SOURCE, Library, "matvec kernel")


def choose_matvec(setting: str, *, dtype: torch.dtype, device: torch.device, quantization: str
                  ) -> tuple[Library | None, str]:
    """(the library, or None for torch's matmul; the reason, for /info and the log) for Config.matvec."""
    if setting == "torch":
        return None, "torch: asked for"
    if device.type != "cpu":
        return None, f"{setting}: torch's matmul on {device.type} (the kernel is for CPUs)"
    if quantization != "none":
        return None, f"{setting}: {quantization} linears run their own kernels"
    if dtype not in _DTYPE_CODES:
        return None, f"{setting}: the kernel runs float32 and bfloat16, not {str(dtype).removeprefix('torch.')}"
    library, reason = load()
    if library is None:
        if setting == "tandem":
            log.warning("matvec: torch's matmul instead of the asked-for kernel: %s", reason)
        return None, f"{setting}: torch's matmul: {reason}"
    isa = f"{library.isa}, AVX512-BF16 tiles" if dtype == torch.bfloat16 and library.bfloat16_tiles else library.isa
    return library, (f"{setting}: Tandem's kernel ({isa}) for steps of up to {library.max_tokens_for(dtype)} tokens, "
                     "torch's GEMM above (values not bit-identical to torch's, greedy tokens identical)")


class MatVecLinear:
    """Linears over one input as one projection: [T, K] -> [T, N1 + N2 + ...], each weight's outputs in its own
    columns (q, k and v; gate and up; or one linear), through the kernel for T <= library.max_tokens, torch above."""

    def __init__(self, library: Library, linears: list[nn.Linear], num_threads: int):
        self.library, self.lib, self.num_threads = library, library.lib, num_threads
        self.linears = linears
        self.weights = [linear.weight for linear in linears]
        self.biases = [linear.bias for linear in linears]
        self.in_features = linears[0].in_features
        self.out_features = sum(linear.out_features for linear in linears)
        self.dtype = self.weights[0].dtype
        self.code = _DTYPE_CODES[self.dtype]
        # (weight pointer, row stride, bias pointer, first output column, rows) per linear
        self.calls = []
        column = 0
        for weight, bias in zip(self.weights, self.biases):
            self.calls.append((weight.data_ptr(), weight.stride(0), 0 if bias is None else bias.data_ptr(), column,
                               weight.shape[0]))
            column += weight.shape[0]

    @staticmethod
    def supports(linear: nn.Module) -> bool:
        """A float32/bfloat16 nn.Linear whose weight rows are contiguous (as loaded, not the transposed layout)."""
        return (isinstance(linear, nn.Linear) and linear.weight.dtype in _DTYPE_CODES
                and linear.weight.device.type == "cpu" and linear.weight.stride(1) == 1
                and (linear.bias is None or linear.bias.is_contiguous()))

    def fallback(self, x: torch.Tensor) -> torch.Tensor:
        """torch's product, for an input the kernel does not run (more than max_tokens tokens, another dtype)."""
        if len(self.linears) == 1:
            return F.linear(x, self.weights[0], self.biases[0])
        if x.dim() != 2 or x.dtype != self.dtype:
            return torch.cat([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)], dim=-1)
        # each product straight into its columns (BLAS writes a row-major slice in place): the same values as
        # torch.cat of the products without the copy, which costs a long prompt's q/k/v and gate/up products a
        # visible share of their time, more in bfloat16 than in float32
        y = torch.empty(x.shape[0], self.out_features, dtype=self.dtype)
        for (*_, column, rows), weight, bias in zip(self.calls, self.weights, self.biases):
            if bias is None:
                torch.mm(x, weight.t(), out=y[:, column:column + rows])
            else:
                torch.addmm(bias, x, weight.t(), out=y[:, column:column + rows])
        return y

    def runs(self, x: torch.Tensor) -> bool:
        """Whether the kernel computes this input (else torch does)."""
        return (x.dim() == 2 and x.shape[0] <= self.library.max_tokens_for(self.dtype) and x.dtype == self.dtype
                and x.stride(1) == 1)

    def __call__(self, x: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        # x: [T, K] -> [T, N]; with norm (an RMSNorm's weight [K] and eps, for an input the kernel runs), of x
        # RMS-normalized first, as lean_decode.rms_norm computes it
        if not self.runs(x):
            assert norm is None, "a normalized input is for the kernel only (lean_decode normalizes the others)"
            return self.fallback(x)
        return self.kernel(x, norm)

    def kernel(self, x: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None,
               pause: Pause | None = None) -> torch.Tensor:
        """The kernel's product, for an input that `runs` (the caller checked: a decode step asks once). `pause`: in
        parts of PAUSE_ROWS output rows, the flag looked at between them (the same values as in one call)."""
        num_tokens = x.shape[0]
        y = torch.empty(num_tokens, self.out_features, dtype=self.dtype)
        x_ptr, ldx, y_ptr, size = x.data_ptr(), x.stride(0), y.data_ptr(), y.element_size()
        norm_ptr, eps = (None, 0.0) if norm is None else (norm[0].data_ptr(), norm[1])
        for w_ptr, ldw, b_ptr, column, rows in self.calls:
            part = PAUSE_ROWS if pause is not None else rows
            for first in range(0, rows, part):
                if first:
                    pause.check()
                if self.lib.tandem_matvec(self.code, w_ptr + first * ldw * size, ldw, x_ptr, ldx,
                                          y_ptr + (column + first) * size, self.out_features, num_tokens,
                                          min(part, rows - first), self.in_features,
                                          (b_ptr + first * size) if b_ptr else None, norm_ptr, eps, self.num_threads):
                    raise MemoryError(f"matvec: no memory for a [{num_tokens}, {self.in_features}] input buffer")
        return y


def matvec_projection(library: Library | None, *linears: nn.Module):
    """A MatVecLinear over `linears` where the kernel runs and all of them suit it, else None."""
    if library is None or not linears or not all(MatVecLinear.supports(linear) for linear in linears):
        return None
    if len({(linear.in_features, linear.weight.dtype) for linear in linears}) != 1:
        return None
    return MatVecLinear(library, list(linears), torch.get_num_threads())
