"""The engine's reference forward: the model's own Hugging Face modules (embeddings, norms, the q/k/v/o projections,
MLPs, and the model's rotary module, so RoPE scaling matches Hugging Face exactly), with attention over the paged KV
cache (attention.py).

The lean forward (lean_decode.py) computes the same values with far fewer tensor ops and runs the engine's steps;
this one is what it is held to bit for bit (tests/inference/engine/test_lean_decode.py), and what runs where the lean
forward does not: a compiled decode step (compilation.py: torch.compile traces it), speculative layer drafts and
verification (speculation_forward.py), `lean_decode: false`, and a model the lean forward cannot run exactly.
"""
from __future__ import annotations

import torch

from inference.engine.compilation import write_kv
from inference.engine.kv_pool import KVPool


class ReferenceForward:
    def __init__(self, model, pool: KVPool, dtype: torch.dtype):
        self.model, self.pool, self.dtype = model, pool, dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                attention, num_layers: int | None = None) -> torch.Tensor:
        # input_ids, positions, slot_mapping: [T]  ->  hidden: [T, hidden]
        # num_layers: the first layers only (a speculative layer draft), else all of them.
        model, pool = self.model.model, self.pool
        shape = pool.shape
        num_tokens = input_ids.shape[0]
        h_q, h_kv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
        x = model.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = model.rotary_emb(x, positions.unsqueeze(0))  # [1, T, D] each
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, D]
        k_slots = pool.k_cache.view(shape.num_layers, -1, h_kv, d)  # [L, N*bs, Hkv, D]
        v_slots = pool.v_cache.view(shape.num_layers, -1, h_kv, d)
        narrow = pool.kv_dtype != self.dtype  # rounded once on the way into a narrower cache
        for layer_id, layer in enumerate(model.layers[:num_layers]):
            attn = layer.self_attn
            h = layer.input_layernorm(x)  # [T, hidden]
            if hasattr(attn, "qkv_proj"):  # int8, or fused by fusion.py: one projection for q, k and v
                q, k, v = attn.qkv_proj(h).split((h_q * d, h_kv * d, h_kv * d), dim=-1)
                q, k, v = q.view(num_tokens, h_q, d), k.view(num_tokens, h_kv, d), v.view(num_tokens, h_kv, d)
            else:
                q = attn.q_proj(h).view(num_tokens, h_q, d)  # [T, Hq, D]
                k = attn.k_proj(h).view(num_tokens, h_kv, d)  # [T, Hkv, D]
                v = attn.v_proj(h).view(num_tokens, h_kv, d)  # [T, Hkv, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if torch.compiler.is_compiling():  # one opaque op, written in place (compilation.write_kv)
                write_kv(pool.k_cache, pool.v_cache, layer_id, slot_mapping, k, v)
            else:
                k_slots[layer_id].index_copy_(0, slot_mapping, k.to(pool.kv_dtype) if narrow else k)
                v_slots[layer_id].index_copy_(0, slot_mapping, v.to(pool.kv_dtype) if narrow else v)
            o = attention(layer_id, q, k, v, attn.scaling)  # [T, Hq, D]
            x = x + attn.o_proj(o.reshape(num_tokens, h_q * d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    # x: [..., D] -> [..., D], (x1, x2) -> (-x2, x1) as in Hugging Face's Llama
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
