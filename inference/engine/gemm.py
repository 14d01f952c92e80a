"""The float32 GEMM of CPU steps of many tokens (batched decode, prefill): oneDNN's instead of torch's (MKL's).

Tandem's matvec kernel (matvec.py) multiplies steps of at most `Library.max_tokens` tokens; above, the linears were
torch's `F.linear`, which for float32 on a CPU is MKL's sgemm (bfloat16 already goes through oneDNN in torch). On an
AMD CPU MKL does not take its fast paths: oneDNN's GEMM ran SmolLM2-135M's linears clearly faster at every batch
size, and MKL's sgemm had been most of a float32 decode step of many sequences (docs/performance.md, 'Batched
decode').

oneDNN is called through `torch.ops.mkldnn._linear_pointwise` (what inductor's CPU linears call) on the weights as
loaded ([out, in], dense): oneDNN reorders them on every call. A packed copy is faster still, but holds the float
weights twice (the kernel reads the loaded ones): the opt-in `packed_weights` setting (packed_weights.py). Its sums
run in another order than MKL's, so values are not bit-identical to torch's linear; greedy tokens are
(tests/inference/engine/test_gemm.py). It runs where the kernel runs (Config.matvec resolved to Tandem's, float
weights): with `matvec="torch"`, torch's matmul everywhere, as before.

Not on an Intel CPU: there MKL is Intel's own and runs its fast paths. On an Intel CPU with AMX MKL ran the linears
as fast as oneDNN at a few dozen tokens and somewhat faster at prefill's thousands, where a prefill through oneDNN
was slower than transformers' (MKL's) own forward (docs/performance.md, 'Prefill against the compute peak').
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.kernels.matvec import Library, MatVecLinear, matvec_projection
from inference.hardware import cpu_vendor


@functools.cache
def onednn_preferred() -> bool:
    """Whether oneDNN's float32 GEMM is the one to run here: everywhere but on an Intel CPU (see the docstring)."""
    return cpu_vendor() != "GenuineIntel"


@functools.cache
def onednn_runs() -> bool:
    """Whether this torch build has oneDNN's CPU linear (probed once on a tiny product, checked against F.linear)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w = torch.arange(128.0).view(8, 16) / 128, torch.arange(64.0).view(4, 16) / 64  # no draw from torch's RNG
        return torch.allclose(_linear(x, w, None), F.linear(x, w), atol=1e-4)
    except (RuntimeError, AttributeError):
        return False


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # x: [T, K], weight: [N, K] -> [T, N]
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class GemmMatVecLinear(MatVecLinear):
    """Tandem's kernel for steps of up to `library.max_tokens` tokens, oneDNN's GEMM above (float32 on a CPU)."""

    def fallback(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N1 + N2 + ...]
        if x.dim() != 2 or x.dtype != torch.float32:
            return super().fallback(x)
        x = x.contiguous()
        if len(self.weights) == 1:
            return _linear(x, self.weights[0], self.biases[0])
        return torch.cat([_linear(x, w, b) for w, b in zip(self.weights, self.biases)], dim=-1)


def note(library: Library | None, dtype: torch.dtype, quantization: str, packed: bool = False) -> str:
    """What the `matvec` reason (/info) adds where oneDNN takes the kernel's steps of more tokens (`packed`: over
    prepacked weights, packed_weights.py), else ""."""
    if library is not None and packed:
        return (f"; steps of more than {library.max_tokens_for(dtype)} tokens: oneDNN's GEMM over prepacked weights "
                "(packed_weights)")
    if library is None or quantization != "none" or dtype != torch.float32 or not onednn_runs():
        return ""
    if not onednn_preferred():
        return f"; float32 steps of more than {library.max_tokens} tokens: MKL's GEMM (an Intel CPU; gemm.py)"
    return f"; float32 steps of more than {library.max_tokens} tokens: oneDNN's GEMM, not MKL's (gemm.py)"


def kernel_projection(library: Library | None, *linears: nn.Module,
                      packer: Callable[[MatVecLinear], MatVecLinear] | None = None) -> MatVecLinear | None:
    """matvec_projection's projection over `linears` (None where the kernel does not run them), with its steps of
    more tokens through `packer`'s projection where given (packed_weights.py), else through oneDNN where they are
    float32, oneDNN runs here and the CPU is not Intel's."""
    kernel = matvec_projection(library, *linears)
    if kernel is not None and packer is not None:
        return packer(kernel)
    if kernel is None or kernel.dtype != torch.float32 or not onednn_runs() or not onednn_preferred():
        return kernel
    return GemmMatVecLinear(library, kernel.linears, kernel.num_threads)
