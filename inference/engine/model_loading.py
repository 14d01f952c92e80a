"""What a runner loads before its first step: the model (of a supported architecture), its shape, its context limit,
its end tokens, and the zero-filled KV pool (model_runner.py and kv_pool.py build on these)."""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

# Architectures whose decoder layer is Llama's (pre-norm, RoPE, GQA attention, gated MLP) under the same module names.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The sizes every part of the runner shapes its tensors by."""
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int


def model_shape(hf_config) -> ModelShape:
    num_heads = hf_config.num_attention_heads
    return ModelShape(num_layers=hf_config.num_hidden_layers, num_heads=num_heads,
                      num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
                      head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
                      hidden_size=hf_config.hidden_size, vocab_size=hf_config.vocab_size)


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled KV pool. Zeros, not garbage: decode attention reads (and masks out) unused slots, and masked
    garbage that happens to be NaN would still poison the softmax.

    On CPU the tensor lies in an anonymous memory map: the kernel hands out zeroed pages as they are first written,
    so a pool costs RAM only for the blocks in use, and allocating it costs no time (torch.zeros writes every byte
    at start: the whole pool in RSS, seconds for gigabytes). Elsewhere torch.zeros."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    # frombuffer keeps the map alive as long as the tensor.
    return torch.frombuffer(mmap.mmap(-1, num_bytes), dtype=dtype).view(shape)


def load_model(path: str, dtype: torch.dtype, device: torch.device):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    model_type = model.config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported by the engine "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return model.to(device).eval()


def resolve_max_model_len(hf_config, requested: int | None) -> int:
    limit = hf_config.max_position_embeddings
    # Sliding-window attention differs from full attention only past the window, so stay inside it.
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", True):
        limit = min(limit, hf_config.sliding_window)
    if requested is None:
        return limit
    if requested > limit:
        raise ValueError(f"max_model_len={requested} exceeds what the model supports ({limit})")
    return requested


def eos_token_ids(model) -> frozenset[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    if ids is None:
        ids = model.config.eos_token_id
    if ids is None:
        return frozenset()
    return frozenset([ids] if isinstance(ids, int) else ids)
