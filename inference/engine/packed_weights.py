"""Prepacked weights for CPU steps of many tokens (`Config.packed_weights`, off by default): the float linears of
prefill chunks and of decode batches above Tandem's matvec kernel's tokens run oneDNN's GEMM over a copy of each
weight reordered once, at start, into the GEMM's blocked layout.

Why: above the kernel's few tokens a step's linears are a GEMM (torch's, or oneDNN's over the weights as loaded:
gemm.py), which reorders every weight into its blocked layout on every call. At a few dozen tokens that reorder is a
sizeable share of the product, most of all in bfloat16 on a CPU with AMX; at a long prompt's thousands it is spread
thin (docs/performance.md, 'Prepacked weights', has the figures; bench/engine/packed_weights.py measures them).
vLLM's CPU backend holds only packed weights.

Why opt-in: the matvec kernel, which runs every single-token step, reads the weights as loaded ([out, in] rows), and
it cannot read oneDNN's blocked copy; so the float weights are held twice (lm_head too: a many-sequence step computes
its logits through it, and it is as wide as a fifth of a small model). `weight_bytes` counts both, and /info says so
under `matvec.packed_weights`. An operator trades that memory for the faster steps.

Why oneDNN's packed GEMM (`mkldnn._reorder_linear_weight`, as inductor's CPU weight prepacking holds it) and not
MKL's (`mkl._mkl_reorder_linear_weight`): MKL packs a weight for one number of tokens and runs any other through the
weights as loaded, and a step's tokens vary with the batch and the chunk. q/k/v and gate/up are packed as one matrix
each: one GEMM where the loaded weights take two or three.

Where the matvec kernel does not run (matvec "torch", the transposed layout, INT8, CUDA), or the lean forward is off,
nothing is packed and the reason says why. Values: oneDNN sums in another order than the dense GEMM, so they are not
bit-identical to the unpacked engine's; greedy tokens are (tests/inference/engine/test_packed_weights.py).
"""
from __future__ import annotations

import functools

import torch

from inference.engine.kernels.matvec import Library, MatVecLinear
from inference.engine.quantization import _fused

# The number of tokens oneDNN is told to pack for. The layout it picks serves steps of any number of tokens; this is
# the CPU's default chunk beside running decodes (Config.prefill_chunk_size), and layouts packed for other counts
# ran the engine's step sizes no faster.
PACK_TOKENS = 64


@functools.cache
def packs(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN's linear over a prepacked weight of `dtype` (probed once on a tiny
    product, checked against the dense one)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x = (torch.arange(128.0).view(8, 16) / 128).to(dtype)  # no draw from torch's RNG
        w = (torch.arange(64.0).view(4, 16) / 64).to(dtype)
        y = _linear(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_TOKENS), None)
        return torch.allclose(y.float(), (x.float() @ w.float().t()), atol=0.05)
    except (RuntimeError, AttributeError):
        return False


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # x: [T, K], packed: oneDNN's blocked [N, K] -> [T, N]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedMatVecLinear(MatVecLinear):
    """Tandem's kernel for the steps it takes; above, oneDNN's GEMM over one prepacked copy of all its linears."""

    def __init__(self, kernel: MatVecLinear):
        super().__init__(kernel.library, kernel.linears, kernel.num_threads)
        weight, bias = _fused(*self.linears)  # [N1 + N2 + ..., K], each linear's rows in its output columns
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_TOKENS)
        self.packed_bias = bias
        self.num_packed_bytes = torch.ops.mkldnn._nbytes(self.packed) + (0 if bias is None else bias.nbytes)

    def fallback(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N1 + N2 + ...]
        if x.dim() != 2 or x.dtype != self.dtype:
            return super().fallback(x)
        return _linear(x.contiguous(), self.packed, self.packed_bias)


class WeightPacker:
    """Makes a runner's kernel projections packed ones (kernel_projection's `packer`) and counts their copies."""

    def __init__(self):
        self.num_projections = 0
        self.num_packed_bytes = 0

    def __call__(self, kernel: MatVecLinear) -> PackedMatVecLinear:
        packed = PackedMatVecLinear(kernel)
        self.num_projections += 1
        self.num_packed_bytes += packed.num_packed_bytes
        return packed


def choose_packing(config, matvec: Library | None, dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """(whether the float weights are packed, why) for `config.packed_weights`, where `matvec` (the kernel, or None),
    `dtype` and `device` are what the runner's plan resolved (kernel_plan.py)."""
    quantization = config.quantization
    if not config.packed_weights:
        return False, ("off (the default): steps above the matvec kernel's tokens run a GEMM that reorders each "
                       "weight on every call; on, a copy reordered once, the float weights held twice")
    if device.type != "cpu":
        return False, f"asked for, but a CPU setting: {device.type} runs its own GEMM"
    if quantization != "none":
        return False, f"asked for, but {quantization} weights are packed by their own kernels"
    if matvec is None:
        return False, ("asked for, but the matvec kernel does not run here (see matvec): the packed copy serves the "
                       "steps above it, beside the weights it reads")
    if not config.lean_decode:
        return False, "asked for, but lean_decode is off: the reference forward runs the weights as loaded"
    if not packs(dtype):
        return False, f"asked for, but this torch build or CPU has no oneDNN linear over packed {_name(dtype)} weights"
    return True, (f"asked for: {_name(dtype)} steps of more than {matvec.max_tokens_for(dtype)} tokens run oneDNN's "
                  "GEMM over a prepacked copy of the float weights, held beside the loaded ones the matvec kernel "
                  "reads (weight_bytes counts both)")


def packed_bytes(packer: WeightPacker | None) -> int:
    return packer.num_packed_bytes if packer else 0


def info(packer: WeightPacker | None, reason: str) -> dict:
    """/info's `matvec.packed_weights`: whether copies are held, their bytes, and why."""
    if packer is not None and not packer.num_projections:
        reason = "asked for, but no projection runs the matvec kernel here (the lean forward does not run this model)"
    return {"enabled": bool(packer and packer.num_projections),
            "packed_bytes": packed_bytes(packer), "reason": reason}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
