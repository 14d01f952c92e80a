"""INT8 linears for CPU steps through Tandem's kernel (int8_matvec.c), the int8 matrix held once.

A single-stream decode step reads every weight once: it is bound by how fast the weights stream from memory, and
int8 weights are a quarter of float32's bytes. fbgemm's dynamic-quantization linear (quantization.FbgemmInt8Linear)
spends a decode step on its own overhead instead (quantizing the activations, a few tensor ops around each call):
at one thread its step took a few times as long as reading its weights once. The kernel reads each int8
row once and multiplies it with the step's tokens, each rounded to int16 with its own scale (max |x| / 32767) once
per call, by AVX2's 16-bit integer multiply-add with exact integer sums: twice the multiplies per instruction of the
float32 FMA the kernel used before, which a step of many sequences needs (with AVX512-VNNI, steps of 4 tokens or
more fuse the multiply-add and the add into one vpdpwssd: the same sums, fewer instructions). A token's
rounding depends on that token alone, and 16 bits keep the outputs as close to the float model's as float activations
did: SmolLM2's mean KL of the next-token distributions from float32's, 0.00462 with int16 activations against 0.00459
with float32 ones (test_int8_engine's text; 0.00649 against 0.00648 over 6 texts decoded token by token), where
fbgemm's 8-bit activations gave 0.12 on an AVX2 CPU without VNNI (docs/engine.md, "INT8 weights").

Steps of fewer tokens in another dtype (bfloat16 activations) run the kernel on a float32 copy of the step's input.
Steps of GEMM_TOKENS tokens or more (long prefills) dequantize each weight for the call and run torch's float GEMM,
which computes many tokens at once faster than the kernel's passes over the weights (one per 16 tokens), on the
float activations (not rounded to int16: within half an int16 step per activation of the kernel's values). Not taken
(docs/performance.md, 'INT8 kernels by CPU and role'): `torch._int_mm` with 8-bit per-token activations (several times
the KL from float32 of weight-only), the same with 16-bit activations split in two int8 halves (slower than fbgemm's
prefill; and without VNNI oneDNN's int8 GEMM saturated its 16-bit pair sums on them), torch's weight-only CPU op
`aten._weight_int8pack_mm` (far slower than fbgemm in this torch build). fbgemm itself would need its own packed copy of
the weights: memory is why INT8 is picked.

The library is built from int8_matvec.c at install (build.py) and loaded with ctypes; where it cannot run (no
compiler, a CPU without AVX2 with FMA) `load` says why and the engine keeps fbgemm.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels.build import KernelLibrary, load_library

SOURCE = Path(__file__).with_name("int8_matvec.c")
# Steps of at least this many tokens dequantize and run torch's GEMM; fewer run the kernel. On a CPU with AVX2 and
# no AVX-512 the kernel is clearly faster than the float GEMM at a few dozen tokens, about even by a few hundred
# (the lm_head far faster at any: its dequantization costs the same at any number of tokens). Kept at 128, not
# 256: past it the kernel gains little, and a CPU with AVX-512 doubles the float GEMM's FMAs but not the kernel's
# multiply-adds (AVX2 only). The figures: docs/performance.md, 'INT8 kernels by CPU and role'.
GEMM_TOKENS = 128


class Library(KernelLibrary):
    """The loaded kernel: `isa` is what it runs on this CPU (avx2+fma, on AVX-512 CPUs too); `vnni`: whether its
    steps of 4 tokens or more multiply-add with AVX512-VNNI's vpdpwssd (the same exact sums, so the same values)."""

    def __init__(self, lib: ctypes.CDLL):
        super().__init__(lib, "tandem_int8_matvec")
        lib.tandem_int8_matvec.restype = ctypes.c_int
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.tandem_int8_matvec.argtypes = [ptr, i64, ptr, ptr, i64, ptr, i64, i64, i64, i64, ptr, ptr, ctypes.c_float,
                                           ctypes.c_int]
        lib.tandem_int8_matvec_vnni.restype = ctypes.c_int
        lib.tandem_int8_matvec_vnni.argtypes = [ctypes.c_int]
        self.vnni = bool(lib.tandem_int8_matvec_vnni(-1))

    def use_vnni(self, on: bool) -> bool:
        """VNNI's multiply-add on or off (where the CPU has it) from now on, in this process; returns whether it is
        used."""
        self.vnni = bool(self.lib.tandem_int8_matvec_vnni(1 if on else 0))
        return self.vnni


@functools.lru_cache(maxsize=1)
def load() -> tuple[Library | None, str | None]:
    """(the library, None) or (None, why it cannot run here). Built at install, else on first use (build.py)."""
    return load_library(SOURCE, Library, "int8 kernel")


def dequantized_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """x @ (weight_int8 * scale).T + bias in float32, the weight dequantized for this call only."""
    # x: [M, K] float32, weight_int8: [N, K], scale: [N] float32  ->  [M, N] float32
    return F.linear(x, weight_int8.float().mul_(scale[:, None]), bias)


class MatVecInt8Linear(nn.Module):
    """int8 weight [N, K] and float32 scales [N] (one per output channel), held once: the kernel for steps of fewer
    than GEMM_TOKENS tokens (in float32), a dequantized GEMM for longer ones."""

    def __init__(self, library: Library, weight_int8: torch.Tensor, scale: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        assert weight_int8.dtype == torch.int8 and weight_int8.stride(1) == 1 and scale.dtype == torch.float32
        self.out_features, self.in_features = weight_int8.shape
        # Buffers, not copies: a tied lm_head shares the embedding table's int8 matrix (quantization.Int8Matrix).
        self.register_buffer("weight_int8", weight_int8)  # [N, K]
        self.register_buffer("scale", scale.contiguous())  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())  # [N]
        self.num_threads = torch.get_num_threads()
        # The kernel's fixed arguments, read once: a decode step makes ~120 calls, and each buffer lookup on a
        # module costs as much as the C call's own argument conversion (the buffers never move: CPU only).
        self._matrix = (self.weight_int8.data_ptr(), self.weight_int8.stride(0), self.scale.data_ptr())
        self._bias_ptr = None if self.bias is None else self.bias.data_ptr()
        self._call = library.lib.tandem_int8_matvec

    def runs(self, x: torch.Tensor) -> bool:
        """Whether the kernel computes this [T, K] input (else the dequantized GEMM does)."""
        return 0 < x.shape[0] < GEMM_TOKENS and x.dtype == torch.float32 and x.stride(1) == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K]  ->  [..., N] in x's dtype
        if x.dim() == 2 and self.runs(x):  # a decode step's [T, K], as the lean forward passes it: no reshapes
            return self.kernel(x)
        flat = x.reshape(-1, self.in_features)  # [M, K]
        if 0 < flat.shape[0] < GEMM_TOKENS:  # bfloat16 activations too: a short step's copy in float32 is small
            y = self.kernel(flat.float().contiguous())
        else:
            y = self.long_step(flat)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def long_step(self, flat: torch.Tensor) -> torch.Tensor:
        """A step of GEMM_TOKENS tokens or more: [M, K] -> [M, N] float32, the weight dequantized for the call."""
        return dequantized_linear(flat.float(), self.weight_int8, self.scale, self.bias)

    # A C call cannot be traced: a compiled step (Config.compile) runs it eagerly between its graphs, and without
    # this dynamo would retrace it per module until its recompile limit (where an eager call costs next to nothing).
    @torch.compiler.disable
    def kernel(self, x: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """The kernel's product for an input that `runs`; with norm (an RMSNorm's float32 weight [K] and eps), of x
        RMS-normalized first, as lean_decode.rms_norm computes it."""
        # x: [T, K] float32 -> [T, N] float32
        num_tokens, n = x.shape[0], self.out_features
        y = torch.empty(num_tokens, n)
        norm_ptr, eps = (None, 0.0) if norm is None else (norm[0].data_ptr(), norm[1])
        if self._call(*self._matrix, x.data_ptr(), x.stride(0), y.data_ptr(), n, num_tokens, n, self.in_features,
                      self._bias_ptr, norm_ptr, eps, self.num_threads):
            raise MemoryError(f"int8 matvec: no memory for a [{num_tokens}, {self.in_features}] input buffer")
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 matvec, int16 activations"


class SplitInt8Linear(MatVecInt8Linear):
    """The kernel for the steps it `runs` (a decode step's few tokens), `gemm` (another int8 linear of the same
    weights, fbgemm's on a CPU with VNNI) for the longer ones: a prefilling and decoding worker gets the kernel's
    decode and the int8 GEMM's prefill, at the price of holding the int8 matrix twice (the kernel's rows and the
    GEMM's packed copy). A subclass, so that the lean decode and the fused layer loop take its kernel as their own."""

    def __init__(self, library: Library, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 gemm: nn.Module):
        super().__init__(library, weight_int8, scale, bias)
        self.gemm = gemm

    def long_step(self, flat: torch.Tensor) -> torch.Tensor:
        return self.gemm(flat.float())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}; steps of {GEMM_TOKENS} tokens or more: {self.gemm.extra_repr()}"
