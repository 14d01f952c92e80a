"""Which kernels a runner uses, and why: one plan, decided once by `plan_kernels` from the config, the device, the
model's precision and head size, and what the kernels' build left loadable (kernels/build.py), before any weight is
touched. The helpers that run the kernels (the lean forward, the fused decode layers, a step's attention) receive the
plan and the tensors they work on; /info's `matvec` is the plan's reasons.

The choices depend on one another, in this order (each chooser says why, for /info and the log):
1. INT8 weights: the int8 kernel by device, CPU, role and the `matvec` setting (quantization.default_kernel).
2. The matvec kernel for the float linears of steps of a few tokens (matvec.choose_matvec).
3. How the float weights lie (fusion.choose_weight_layout): the transposed layout turns the matvec kernel off, which
   reads the weights as loaded.
4. Packed copies of the float weights for the steps above the kernel's tokens (packed_weights.choose_packing), and
   whose GEMM runs those steps otherwise (gemm.note).
5. Whether the decode step is compiled (compilation.py): torch's attention runs inside a compiled step.
6. The decode rows' attention (paged_attention.py) and the prefill chunks' (prefill_attention.py).
7. A decode step's layers in one C call (decode_layers.py): where the lean forward runs and Tandem's kernels run
   every projection and the attention.

The plan is frozen. A bench that compares one kernel with torch's path on the same engine gives the runner a plan
without it (dataclasses.replace): the next step's attention reads the runner's plan.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

import inference.engine.kernels.decode_layers as decode_layers
from inference.engine.compilation import missing_requirement
from inference.engine.config import Config
from inference.engine.fusion import choose_weight_layout, file_dtype
from inference.engine.gemm import note as gemm_note
from inference.engine.kernels.int8_linear import GEMM_TOKENS
from inference.engine.kernels.matvec import WIDE_MAX_TOKENS, Library as MatVec, choose_matvec
from inference.engine.kernels.paged_attention import Library as PagedAttention, choose_decode_attention
from inference.engine.kernels.prefill_attention import Library as PrefillAttention, choose_prefill_attention
from inference.engine.packed_weights import WeightPacker, choose_packing, info as packed_weights_info
from inference.engine.quantization import default_kernel, kernel_note
from inference.roles import Role

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KernelPlan:
    setting: str  # Config.matvec as asked: auto, tandem or torch
    lean: bool  # the lean forward runs the steps (lean_decode.py), else the reference forward
    int8_kernel: str | None  # quantization.KERNELS, or None for float weights
    matvec: MatVec | None  # Tandem's kernel for the float linears of a few tokens, or None: torch's matmul
    matvec_reason: str
    weight_layout: str  # as_loaded or transposed (fusion.py)
    weight_layout_reason: str
    packs_weights: bool  # prepacked copies for the steps above the kernel's tokens (packed_weights.py)
    packed_weights_reason: str
    compiled_decode: bool  # the decode step runs compiled (compilation.py)
    paged_attention: PagedAttention | None  # the decode rows' attention, or None: torch's gather and SDPA
    decode_attention_reason: str
    prefill_attention: PrefillAttention | None  # the prefill chunks' attention, or None: torch's SDPA
    prefill_attention_reason: str
    decode_layers: decode_layers.Library | None  # a decode step's layers in one C call, or None: the lean forward
    decode_layers_capacity: int  # the most tokens the C layers' scratch rows hold
    decode_layers_reason: str

    @property
    def decode_attention_info(self) -> dict:
        return {"kernel": "tandem" if self.paged_attention else "torch", "reason": self.decode_attention_reason}

    @property
    def prefill_attention_info(self) -> dict:
        return {"kernel": "tandem" if self.prefill_attention else "torch", "reason": self.prefill_attention_reason}


def plan_kernels(config: Config, device: torch.device, *, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int,
                 lean_reason: str | None) -> KernelPlan:
    """The kernels of a runner of `config` on `device` whose activations run in `dtype` over a `kv_dtype` cache;
    `lean_reason`: why the lean forward cannot run this model, or None."""
    setting, quantization = config.matvec, config.quantization
    lean = config.lean_decode and lean_reason is None
    if config.lean_decode and not lean:
        log.warning("lean decode: using the reference forward: %s", lean_reason)
    int8_kernel = default_kernel(device, setting, role=config.role) if quantization == "int8" else None
    matvec, matvec_reason = choose_matvec(setting, dtype=dtype, device=device, quantization=quantization)
    if int8_kernel:
        matvec_reason += f" ({kernel_note(int8_kernel, setting, role=config.role)})"
    layout, layout_reason = choose_weight_layout(config.weight_layout, dtype=dtype, device=device,
                                                 quantization=quantization, stored=file_dtype(config.model),
                                                 matvec=matvec is not None)
    if layout == "transposed" and matvec is not None:  # the kernel reads [out, in] rows
        matvec, matvec_reason = None, (f"{setting}: torch's matmul: weight_layout transposed (the kernel reads the "
                                       "weights as loaded)")
    packs, packed_reason = choose_packing(config, matvec, dtype, device)
    if matvec is not None:
        matvec_reason += gemm_note(matvec, dtype, quantization, packed=packs)
        log.info("matvec: %s", matvec_reason)
    compiled = (config.compile and config.role is not Role.PREFILL and missing_requirement(device) is None)
    paged, paged_reason = choose_decode_attention(setting, dtype=dtype, device=device, head_dim=head_dim,
                                                  compiled=compiled, kv_dtype=kv_dtype)
    prefill, prefill_reason = choose_prefill_attention(setting, dtype=dtype, device=device, head_dim=head_dim,
                                                       kv_dtype=kv_dtype)
    layers, capacity, layers_reason = _decode_layers(config, dtype, lean=lean, matvec=matvec, paged=paged,
                                                     prompts=prefill is not None and kv_dtype == dtype)
    return KernelPlan(setting=setting, lean=lean, int8_kernel=int8_kernel, matvec=matvec, matvec_reason=matvec_reason,
                      weight_layout=layout, weight_layout_reason=layout_reason, packs_weights=packs,
                      packed_weights_reason=packed_reason, compiled_decode=compiled, paged_attention=paged,
                      decode_attention_reason=paged_reason, prefill_attention=prefill,
                      prefill_attention_reason=prefill_reason, decode_layers=layers, decode_layers_capacity=capacity,
                      decode_layers_reason=layers_reason)


def _decode_layers(config: Config, dtype: torch.dtype, *, lean: bool, matvec: MatVec | None,
                   paged: PagedAttention | None, prompts: bool) -> tuple[decode_layers.Library | None, int, str]:
    """(the decode layers' library or None, the most tokens of a step it takes, why) where the lean forward runs and
    Tandem's kernels run every projection and the attention (decode_layers.py; binding the model's layers may still
    find one it cannot run: decode_layers.bind). `prompts`: the prefill kernel runs prompt rows over this cache."""
    if not config.fused_decode:
        return None, 0, "off: fused_decode is false (the lean forward's ops)"
    if not lean:
        return None, 0, "off: the lean decode forward is off or cannot run this model"
    if paged is None:
        return None, 0, "off: decode attention is torch's (the C layer calls the paged kernel)"
    int8 = config.quantization != "none"
    if not int8 and matvec is None:
        return None, 0, "off: the float linears run torch's matmul (the C layer calls Tandem's matvec kernel)"
    library, reason = decode_layers.load()
    if library is None:
        return None, 0, f"off: {reason}"
    capacity = GEMM_TOKENS - 1 if int8 else WIDE_MAX_TOKENS
    max_tokens = capacity if int8 else min(capacity, matvec.max_tokens_for(dtype))
    kernels = "Tandem's int8 kernel" if int8 else "Tandem's matvec kernel"
    if prompts:
        return library, capacity, (f"on: steps of up to {max_tokens} tokens (decodes, and prompt tokens beside them or "
                                   f"alone) run their layers in one C call ({kernels}, the paged attention kernel and "
                                   "the prefill attention kernel)")
    return library, capacity, (f"on: decode steps of up to {max_tokens} tokens run their layers in one C call "
                               f"({kernels} and the paged attention kernel)")


def matvec_info(plan: KernelPlan, fused_decode_reason: str, packer: WeightPacker | None) -> dict:
    """/info's `matvec`: who multiplies a decode step's tokens by the float linears, and why; under it the decode
    rows' and the prefill chunks' attention, the decode layers in one C call (`fused_decode_reason`: as bound to the
    model's layers) and the packed copies (`packer`: what it packed)."""
    library = plan.matvec
    return {"setting": plan.setting, "kernel": "tandem" if library else "torch",
            "isa": library.isa if library else None, "reason": plan.matvec_reason,
            "decode_attention": plan.decode_attention_info, "prefill_attention": plan.prefill_attention_info,
            "fused_decode": fused_decode_reason,
            "packed_weights": packed_weights_info(packer, plan.packed_weights_reason)}
