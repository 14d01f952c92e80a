"""The lean decode forward: the same layers as the reference forward over the Hugging Face modules
(reference_forward.py), with far fewer tensor ops per step, for the step that runs once per generated token.

A single-stream decode step multiplies one token by every weight once, so beside the matmuls its cost is per-op
overhead: SmolLM2's reference step runs ~60 tensor ops per layer (RMSNorm as six, RoPE as seven for q and seven
for k, a select per cache view, module calls around every linear). Here, per layer:

- RMSNorm as one `F.rms_norm` (float32; in a narrower dtype as Hugging Face computes it: normalized in float32, cast,
  then scaled by the weight);
- RoPE for q and k at once, on the [T, Hq + Hkv, D] slice of the QKV output (a fused `qkv_proj` on INT8 and in the
  transposed weight layout, fusion.py; on a float model as loaded q, k and v as three matmuls over the model's own
  weights, concatenated): x * cos + roll(x, D/2) * sin', where sin' is sin with its first half negated once per
  step: roll(x) * sin' = rotate_half(x) * sin element for element (negation is exact);
- the linears called through `F.linear` on their weights (no module call). Weights as loaded are not fused into new
  tensors: they stay the pages the model was loaded from, which every worker of that model on a host maps once
  (fusing copied them into each process: the demo's two workers then took 0.3 GiB more); the transposed layout
  copies them anyway, and fuses while it does;
- the cache's per-layer views made once, not selected per layer and step.

Every change is exact (the same elementwise operations in the same order; the fused projections compute each output
column alone), so a lean step's hidden states equal the reference's bit for bit in float32, bfloat16 and INT8, and
greedy output is token-identical (tests/inference/engine/test_lean_decode.py). What it saves is op overhead: at one
thread the matrix-vector products still take most of a step (docs/performance.md). Prefill steps run it too
(Config.lean_prefill): every change is as exact at many tokens a step (tests/inference/engine/test_lean_prefill.py).
All of this with torch's matmul (Config.matvec "torch"); where Tandem's kernel runs the linears (matvec.py, and
oneDNN's GEMM above its few tokens, gemm.py), their sums run in another order: values are then not bit-identical to
the reference's, greedy tokens are (tests/inference/engine/test_matvec.py, test_gemm.py). Where those kernels run
every layer, a pure decode step hands the layer loop to C instead (decode_layers.py: `fused`), the same ops without
their dispatch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.fusion import FusedGatedMLP
from inference.engine.gemm import kernel_projection
from inference.engine.interleave import Pause
from inference.engine.kernels.matvec import Library, MatVecLinear
from inference.engine.quantization import Int8GatedMLP

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class LeanLayer:
    attn_in: Projection  # [T, hidden] -> [T, (Hq + 2 Hkv) D]: the input norm, then q/k/v
    o: Projection  # [T, Hq D] -> [T, hidden]
    mlp_in: Projection  # [T, hidden] -> [T, 2 I]: the post-attention norm, then gate/up
    act: Callable[[torch.Tensor], torch.Tensor]
    down: Projection  # [T, I] -> [T, hidden]
    intermediate_size: int
    scale: float


def unsupported_reason(model) -> str | None:
    """Why the lean forward cannot run this model exactly as the reference does, or None."""
    for layer in model.model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
            if not hasattr(norm, "variance_epsilon") or getattr(norm, "weight", None) is None:
                return f"{type(norm).__name__} is not Llama's RMSNorm"
        if not hasattr(layer.self_attn, "scaling"):
            return f"{type(layer.self_attn).__name__} has no attention scale"
    return None


def _projection(module: nn.Module, matvec: Library | None, packer=None) -> Projection:
    # Tandem's kernel for a few tokens (oneDNN's GEMM above, gemm.py; over packed weights with a packer,
    # packed_weights.py), where it runs
    kernel = kernel_projection(matvec, module, packer=packer)
    if kernel is not None:
        return kernel
    if isinstance(module, nn.Linear):  # F.linear on the weights: no module call per step
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    return module.forward


def _concatenated(*modules: nn.Module, matvec: Library | None, packer=None) -> Projection:
    """Unfused projections as one: each output column is computed alone, as a fused matmul computes it (exact);
    through Tandem's kernel, each writes its own columns of one output."""
    kernel = kernel_projection(matvec, *modules, packer=packer)
    if kernel is not None:
        return kernel
    projections = [_projection(module, None) for module in modules]
    return lambda x: torch.cat([projection(x) for projection in projections], dim=-1)


def _norm(norm: nn.Module) -> tuple[torch.Tensor, float]:
    return norm.weight, norm.variance_epsilon


def normed_projection(projection: Projection, norm: tuple[torch.Tensor, float]) -> Projection:
    """(x, pause=None) -> projection(rms_norm(x, norm)); through Tandem's kernel, which normalizes while it widens its
    input (one call instead of the norm's tensor ops: matvec.c), where it runs, and there in parts that look at
    `pause` between them (MatVecLinear.kernel; the LM head of a step that may pause)."""
    weight = norm[0]
    if isinstance(projection, MatVecLinear) and weight.dtype == projection.dtype and weight.is_contiguous():
        def project(x: torch.Tensor, pause: Pause | None = None) -> torch.Tensor:
            return (projection.kernel(x, norm, pause) if projection.runs(x)
                    else projection.fallback(rms_norm(x, norm)))
        return project
    return lambda x, pause=None: projection(rms_norm(x, norm))


def norm_lm_head(model, matvec: Library | None, packer=None) -> Projection:
    """The final norm and lm_head: (hidden [B, hidden], pause=None) -> logits [B, V], through Tandem's kernel too
    where it runs (lm_head is a sizeable share of a small model's weights; the kernel normalizes its input on the way
    in), else the model's own modules."""
    norm, lm_head = model.model.norm, kernel_projection(matvec, model.lm_head, packer=packer)
    if lm_head is not None and unsupported_reason(model) is None:
        return normed_projection(lm_head, (norm.weight, norm.variance_epsilon))
    return lambda hidden, pause=None: model.lm_head(norm(hidden))


def rms_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    # x: [T, hidden] -> [T, hidden], exactly Hugging Face's LlamaRMSNorm
    weight, eps = norm
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


class LeanDecoder:
    """Built once per runner (after quantization) from its kernel plan (kernel_plan.py): holds each layer's weights
    and callables; `forward` has the signature of the reference forward (reference_forward.py)."""

    def __init__(self, model, plan, packer, pool, dtype: torch.dtype):
        # plan: the runner's KernelPlan (Tandem's matvec kernel for steps of a few tokens, or None: matvec.py);
        # packer: prepacked weights for the steps above the kernel's, or None (packed_weights.py); pool: the KV pool
        self.shape = shape = pool.shape
        self.embed = model.model.embed_tokens
        self.rotary = model.model.rotary_emb
        self.layers = []
        matvec = plan.matvec
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            fused_mlp = isinstance(mlp, (FusedGatedMLP, Int8GatedMLP))  # INT8, or fusion.fuse_projections before
            qkv = (_projection(attn.qkv_proj, matvec, packer) if hasattr(attn, "qkv_proj")
                   else _concatenated(attn.q_proj, attn.k_proj, attn.v_proj, matvec=matvec, packer=packer))
            gate_up = (_projection(mlp.gate_up_proj, matvec, packer) if fused_mlp
                       else _concatenated(mlp.gate_proj, mlp.up_proj, matvec=matvec, packer=packer))
            self.layers.append(LeanLayer(
                attn_in=normed_projection(qkv, _norm(layer.input_layernorm)),
                o=_projection(attn.o_proj, matvec, packer),
                mlp_in=normed_projection(gate_up, _norm(layer.post_attention_layernorm)),
                act=mlp.act_fn, down=_projection(mlp.down_proj, matvec, packer),
                intermediate_size=mlp.intermediate_size if fused_mlp else mlp.gate_proj.out_features,
                scale=attn.scaling))
        slots_shape = (shape.num_layers, -1, shape.num_kv_heads, shape.head_dim)
        self.k_slots = pool.k_cache.view(slots_shape).unbind(0)  # L x [N*bs, Hkv, D]
        self.v_slots = pool.v_cache.view(slots_shape).unbind(0)
        self.kv_dtype = pool.kv_dtype if pool.kv_dtype != dtype else None  # a narrower cache's, or None
        self.fused = None  # the layers in one C call (decode_layers.FusedDecode), set by the runner where it runs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                attention, num_layers: int | None = None, pause: Pause | None = None) -> torch.Tensor:
        # input_ids, positions, slot_mapping: [T]  ->  hidden: [T, hidden]; pause: a decode step's, which may stop
        # between layers for a prefill (interleave.py)
        num_tokens = input_ids.shape[0]
        h_q, h_kv, d = self.shape.num_heads, self.shape.num_kv_heads, self.shape.head_dim
        x = self.embed(input_ids)  # [T, hidden]
        cos, sin = self.rotary(x, positions.unsqueeze(0))  # [1, T, D] each, RoPE scaling as the model's own
        cos = cos[0].unsqueeze(1)  # [T, 1, D]
        # [T, 1, D], its first half negated: roll(x) * sin == rotate_half(x) * sin
        sin = torch.cat((-sin[0, :, : d // 2], sin[0, :, d // 2:]), dim=-1).unsqueeze(1)
        layers = self.layers[:num_layers]
        if self.fused is not None and self.fused(x, cos.view(num_tokens, d), sin.view(num_tokens, d), slot_mapping,
                                                 attention, len(layers), pause):
            return x  # a decode step whose layers ran in C (decode_layers.py), x updated in place
        for layer_id, layer in enumerate(layers):
            if layer_id and pause is not None:
                pause.check()
            qkv = layer.attn_in(x).view(num_tokens, h_q + 2 * h_kv, d)
            qk = qkv[:, : h_q + h_kv]  # [T, Hq + Hkv, D]
            rolled = qk.roll(d // 2, -1).mul_(sin)  # the same operations as qk * cos + roll * sin, two buffers fewer
            qk = (qk * cos).add_(rolled)
            # q contiguous: with many sequences, SDPA over a strided q made a step slower.
            q, k, v = qk[:, :h_q].contiguous(), qk[:, h_q:], qkv[:, h_q + h_kv:]
            narrow = self.kv_dtype is not None  # rounded once on the way into a narrower cache (attention: k, v)
            self.k_slots[layer_id].index_copy_(0, slot_mapping, k.to(self.kv_dtype) if narrow else k)
            self.v_slots[layer_id].index_copy_(0, slot_mapping, v.to(self.kv_dtype) if narrow else v)
            o = attention(layer_id, q, k, v, layer.scale)  # [T, Hq, D]
            x = x.add_(layer.o(o.reshape(num_tokens, h_q * d)))  # in place: x is this forward's own (the embedding's)
            gate, up = layer.mlp_in(x).split(layer.intermediate_size, dim=-1)
            x = x.add_(layer.down(layer.act(gate).mul_(up)))
        return x
