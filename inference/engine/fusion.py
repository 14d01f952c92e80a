"""Decode levers on a float model, each applied in place to a ModelRunner's loaded model and measured alone by
bench/engine/stage_limits.py against the engine without it (none is on in the engine unless it pays there):

- `fuse_projections`: q, k and v as one projection (`qkv_proj`, which the runner calls once when it finds it), and
  gate and up as one (`FusedGatedMLP`): fewer, larger matmuls per layer. Each output column is computed alone, so
  the outputs are bit-identical to the separate projections (checked in tests/inference/engine/test_fusion.py).
- `transpose_projections` (CPU, float32): the fused projections' weights stored transposed, which one thread's
  matrix-vector product streams faster. Not bit-identical to torch's own linear over the [N, K] weight.
- `prepack_linears` (CPU, float32): each linear's weight reordered once for MKL's packed GEMM (`_mkl_linear`, what
  inductor's weight prepacking uses), instead of on every call. Not bit-identical to torch's own linear.
"""
from __future__ import annotations

import torch
from torch import nn

from inference.engine.quantization import OutputSlice, _fused


class FusedGatedMLP(nn.Module):
    """Llama's gated MLP with gate and up as one float projection: down(act(gate(x)) * up(x))."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.intermediate_size = mlp.gate_proj.out_features
        weight, bias = _fused(mlp.gate_proj, mlp.up_proj)
        self.gate_up_proj = _linear(weight, bias)
        self.down_proj, self.act_fn = mlp.down_proj, mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden] -> [..., hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


@torch.no_grad()
def fuse_projections(runner) -> None:
    """q/k/v into `qkv_proj` (q_proj, k_proj, v_proj left as slices of it for Hugging Face's own forward), gate/up
    into FusedGatedMLP, in every decoder layer of the runner's model; the separate weights are dropped. Nothing to
    do on a model whose q/k/v are fused already (INT8, or fused once before)."""
    if runner.fused_qkv:
        return
    for layer in runner.model.model.layers:
        attn = layer.self_attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_proj = _linear(*_fused(*projections))
        start = 0
        for name, projection in zip(("q_proj", "k_proj", "v_proj"), projections):
            setattr(attn, name, OutputSlice(attn.qkv_proj, start, start + projection.out_features))
            start += projection.out_features
        layer.mlp = FusedGatedMLP(layer.mlp)
    runner.fused_qkv = True


@torch.no_grad()
def transpose_projections(runner) -> int:
    """The fused q/k/v and gate/up weights of a float32 CPU model stored transposed ([K, N] in memory, the module
    still sees [N, K]): F.linear then streams the weight one input row at a time, which MKL's single-token kernel
    reads ~1.6x faster than the [N, K] rows for SmolLM2's 576-wide inputs. It sums in another order, so outputs are
    not bit-identical. Fuses first (fuse_projections); returns how many weights were transposed. A lean decoder
    built before holds the old weights: build it again after."""
    fuse_projections(runner)
    num_transposed = 0
    for layer in runner.model.model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj):
            if isinstance(linear, nn.Linear) and linear.weight.dtype == torch.float32 and linear.weight.is_contiguous():
                linear.weight = nn.Parameter(linear.weight.t().contiguous().t(), requires_grad=False)
                num_transposed += 1
    return num_transposed


class MklPackedLinear(nn.Module):
    """A float32 CPU linear whose weight MKL reordered once for its packed GEMM."""

    def __init__(self, linear: nn.Linear, batch_size: int = 1):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.batch_size = batch_size
        self.weight = linear.weight  # _mkl_linear takes the original for its shape
        self.bias = linear.bias
        self.register_buffer("packed", torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), batch_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight, self.bias, self.batch_size)
        return y.view(*x.shape[:-1], self.out_features)


@torch.no_grad()
def prepack_linears(runner) -> int:
    """Every nn.Linear of the decoder layers as an MklPackedLinear (CPU, float32). Returns how many were packed."""
    num_packed = 0
    for layer in runner.model.model.layers:
        for parent in list(layer.modules()):
            if isinstance(parent, OutputSlice):  # a view of a fused projection, which is packed where it lives
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
                    setattr(parent, name, MklPackedLinear(child))
                    num_packed += 1
    return num_packed
