"""Decode levers on a float model, each applied in place to a runner's loaded model and measured alone by
bench/engine/stage_limits.py against the engine without it (only those that pay are on in the engine):

- `fuse_projections`: q, k and v as one projection (`qkv_proj`, which the runner calls once when it finds it), and
  gate and up as one (`FusedGatedMLP`): fewer, larger matmuls per layer. Each output column is computed alone, so
  the outputs are bit-identical to the separate projections (checked in tests/inference/engine/test_fusion.py).
- `transpose_weights` (the engine's `weight_layout`, on by default for float32 on a CPU): every float linear's
  weight stored transposed after fusing, which one thread's matrix-vector product streams faster. Not bit-identical
  to torch's own linear over the [N, K] weight; greedy tokens are identical.
- `prepack_linears` (CPU, float32): each linear's weight reordered once for MKL's packed GEMM (`_mkl_linear`, what
  inductor's weight prepacking uses), instead of on every call. Not bit-identical to torch's own linear.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

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
def fuse_projections(model) -> None:
    """q/k/v into `qkv_proj` (q_proj, k_proj, v_proj left as slices of it for Hugging Face's own forward), gate/up
    into FusedGatedMLP, in every decoder layer of the model; the separate weights are dropped. Nothing to do on a
    model whose q/k/v are fused already (INT8, or fused once before)."""
    if hasattr(model.model.layers[0].self_attn, "qkv_proj"):
        return
    for layer in model.model.layers:
        attn = layer.self_attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_proj = _linear(*_fused(*projections))
        start = 0
        for name, projection in zip(("q_proj", "k_proj", "v_proj"), projections):
            setattr(attn, name, OutputSlice(attn.qkv_proj, start, start + projection.out_features))
            start += projection.out_features
        layer.mlp = FusedGatedMLP(layer.mlp)


SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def file_dtype(model_dir) -> torch.dtype | None:
    """The dtype of the float weights in the model folder's safetensors file(s) (read from the first file's header),
    or None when it cannot tell."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    try:
        with open(files[0], "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    except (OSError, ValueError, struct.error):
        return None
    dtypes = {entry.get("dtype") for key, entry in header.items() if key != "__metadata__"}
    found = [SAFETENSORS_DTYPES[name] for name in dtypes if name in SAFETENSORS_DTYPES]
    return found[0] if len(found) == 1 else None


def choose_weight_layout(setting: str, *, dtype: torch.dtype, device: torch.device, quantization: str,
                         stored: torch.dtype | None = None, matvec: bool = False) -> tuple[str, str]:
    """(layout, why) for Config.weight_layout: "as_loaded" or "transposed" (transpose_weights). `stored`: the dtype
    in the model's file (file_dtype). auto transposes float32 weights on a CPU only where they are a private
    conversion anyway: weights of the file's own dtype are mapped from it and shared by every worker of the host
    (the demo saves its model in the dtype its workers run for that), and transposed copies would cost each worker
    the whole model's RAM. `matvec`: Tandem's kernel runs the one-token steps (matvec.py); it reads [out, in] rows
    faster than torch reads either layout, so auto keeps the weights as loaded."""
    if quantization != "none":
        return "as_loaded", f"{quantization} weights lie as their kernels pack them"
    if setting != "auto":
        return setting, "asked for"
    if matvec:
        return "as_loaded", "auto: Tandem's matvec kernel streams the weights as loaded ([out, in] rows)"
    if device.type == "cpu" and dtype == torch.float32:
        if stored == torch.float32:
            return "as_loaded", ("auto: float32 weights mapped from a float32 file are shared by every worker of "
                                 "the host; transposed copies (weight_layout=transposed: faster one-token steps) "
                                 "would take the model's size in each worker")
        return "transposed", ("auto: float32 on a CPU, converted from the file's dtype (a private copy anyway), and "
                              "one-token matmuls read [in, out] weights faster (greedy tokens identical, values not "
                              "bit-identical)")
    return "as_loaded", f"auto: {str(dtype).removeprefix('torch.')} on {device.type} runs the weights as loaded"


@torch.no_grad()
def transpose_weights(model) -> int:
    """Every float linear of the decoder layers and lm_head stored transposed ([in, out] in memory; the module still
    sees [out, in], a transposed view), after fusing q/k/v and gate/up (fuse_projections). Returns how many weights
    were transposed; a lean decoder built before holds the old weights: build it after.

    Why: at one token a step, F.linear over an [out, in] weight is MKL's matrix-vector product, which one thread
    runs at about half the rate a plain sum reads memory; over an [in, out] weight it streams the weight one input
    row at a time, faster a float32 step (bench/engine/decode_kernels.py measures each kernel). The sums
    run in another order, so values are not bit-identical to the loaded layout's; greedy tokens are
    (tests/inference/engine/test_weight_layout.py). Fusing costs nothing here: each weight is copied once anyway.
    A tied embedding reads its rows from lm_head's transposed matrix (a strided gather of the same values), so the
    matrix is still held once. Memory: the copies replace the loaded weights, which for a float32 model loaded
    from a narrower file were a private conversion already; a file of the same dtype loses its shared mapping."""
    embed = model.model.embed_tokens
    tied = isinstance(model.lm_head, nn.Linear) and model.lm_head.weight is embed.weight
    fuse_projections(model)
    linears = [m for layer in model.model.layers for m in layer.modules() if isinstance(m, nn.Linear)]
    if isinstance(model.lm_head, nn.Linear):
        linears.append(model.lm_head)
    num_transposed = 0
    for linear in linears:
        if linear.weight.is_floating_point() and linear.weight.is_contiguous():
            linear.weight = nn.Parameter(linear.weight.t().contiguous().t(), requires_grad=False)
            num_transposed += 1
    if tied:
        embed.weight = model.lm_head.weight
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
def prepack_linears(model) -> int:
    """Every nn.Linear of the decoder layers as an MklPackedLinear (CPU, float32). Returns how many were packed."""
    num_packed = 0
    for layer in model.model.layers:
        for parent in list(layer.modules()):
            if isinstance(parent, OutputSlice):  # a view of a fused projection, which is packed where it lives
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
                    setattr(parent, name, MklPackedLinear(child))
                    num_packed += 1
    return num_packed
