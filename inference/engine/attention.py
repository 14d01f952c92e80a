"""Attention over the paged KV cache for one step: prefill (whole prompts or chunks of them), decode, and a step that
mixes both (chunked prefill on a colocated worker). All of it is device code, called by the model runner per layer
after the layer's new K/V are written into the cache.

The caches are the model runner's [L, N, bs, Hkv, D] tensors; a slot is block_id * block_size + offset.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.engine.kernels.paged_attention import PagedDecode
from inference.engine.kernels.prefill_attention import Library as PrefillKernel


class PrefillAttention:
    """Causal attention within each packed sequence: one SDPA call per sequence and layer.

    A single call over the packed row with a block-diagonal mask would cost (sum of lengths)^2 instead of the sum of
    squares (as many times the work as there are prompts of equal length, and slower); the per-sequence calls are also
    exactly Hugging Face's own causal path. (A varlen kernel, e.g. flash-attn on CUDA, would do both in one call.)

    A chunk that starts at position s > 0 (chunked prefill) attends to the cached K/V of positions [0, s) and to
    itself, causally: its keys are read back from the cache (where this layer just wrote the chunk's own), with a
    mask that lets query position p see key positions <= p. A chunk at s = 0 keeps the fast path (is_causal over its
    own K/V, no cache read).

    With `kernel` (Tandem's prefill kernel, prefill_attention.py), each chunk runs in one C call instead: its own K/V
    read from the step's tensors, a cached prefix's rows in place from the cache, no mask (causal by position). Over a
    cache narrower than the model's (which the kernel does not read), a step with a chunk after a cached prefix keeps
    torch's path; whole prompts still run the kernel (they read only the step's own K/V).
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, bounds: list[tuple[int, int]],
                 contexts: list[tuple[torch.Tensor, torch.Tensor] | None], kernel: PrefillKernel | None = None,
                 num_threads: int = 1):
        num_layers, _, _, num_kv_heads, head_dim = k_cache.shape
        self.k_slots = k_cache.view(num_layers, -1, num_kv_heads, head_dim)  # [L, N*bs, Hkv, D]
        self.v_slots = v_cache.view(num_layers, -1, num_kv_heads, head_dim)
        self.bounds = bounds  # [(start, end)] of each sequence's chunk in the packed row
        # Per sequence: None (chunk at position 0), or (slots [S] of positions [0, end), boolean mask [1, 1, C, S]).
        self.contexts = contexts
        self.kernel, self.num_threads = kernel, num_threads
        self.all_whole = all(context is None for context in contexts)
        # torch's path: the masks as 0 / -inf in the queries' dtype (what SDPA would turn a boolean mask into in every
        # layer), made at the step's first call and read by every layer
        self._masks: list[torch.Tensor | None] | None = None
        self._own_slots: dict[int, torch.Tensor] = {}  # the kernel's slots of a chunk's own K/V: arange(C)

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]  ->  [T, Hq, D]
        if self.kernel is not None and (self.all_whole or self.k_slots.dtype == q.dtype):
            return self._kernel(layer_id, q, k, v, scale)
        # 4-D inputs: with 3-D ones SDPA misses its fused CPU kernel and runs several times slower.
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, T, D]
        if len(self.bounds) == 1 and self.all_whole:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)  # [1, Hq, T, D]
            return o[0].transpose(0, 1)
        if self._masks is None:
            self._masks = [None if c is None else _additive(c[1], q.dtype) for c in self.contexts]
        out = torch.empty_like(q)  # [1, Hq, T, D]
        for (start, end), context, mask in zip(self.bounds, self.contexts, self._masks):
            if context is None:
                out[:, :, start:end] = F.scaled_dot_product_attention(
                    q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], is_causal=True, scale=scale,
                    enable_gqa=True)
            else:
                out[:, :, start:end] = self._with_cached_prefix(layer_id, q[:, :, start:end], context[0], mask, scale)
        return out[0].transpose(0, 1)

    def _with_cached_prefix(self, layer_id: int, q: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
                            scale: float) -> torch.Tensor:
        # q: [1, Hq, C, D]; slots: [S]; mask: [1, 1, C, S]  ->  [1, Hq, C, D]
        # K/V gathered once per KV head and shared by its query heads through enable_gqa (Hugging Face's repeat_kv
        # order), with the additive mask: bit-identical to repeating K/V per query head with a boolean mask, and
        # faster, since K/V are not copied once per query head.
        # a narrower cache's rows in the queries' dtype (exact: every float16 and bfloat16 value is a float32)
        keys = self.k_slots[layer_id].index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D]
        values = self.v_slots[layer_id].index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
        num_groups = q.shape[1] // keys.shape[1]
        if q.device.type != "cpu" and num_groups > 1:  # CUDA's fused kernels take a mask without GQA: -> [1, Hq, S, D]
            keys, values = keys.repeat_interleave(num_groups, 1), values.repeat_interleave(num_groups, 1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)

    def _kernel(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
        for (start, end), context in zip(self.bounds, self.contexts):
            size = end - start
            if context is None:  # over its own K/V: slots 0 .. C - 1 of the step's rows
                slots = self._own_slots.get(size)
                if slots is None:
                    slots = self._own_slots[size] = torch.arange(size, dtype=torch.int64)
                self.kernel.attend(q[start:end], 0, k[start:end], v[start:end], slots, scale, self.num_threads,
                                   out[start:end])
            else:  # over the cache, where this layer just wrote the chunk's own K/V beside the prefix's
                slots = context[0]
                self.kernel.attend(q[start:end], slots.numel() - size, self.k_slots[layer_id], self.v_slots[layer_id],
                                   slots, scale, self.num_threads, out[start:end])
        return out


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True: attend) as 0 / -inf in `dtype`."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), float("-inf"))


class DecodeAttention:
    """One new token per sequence against its cached context, with the query heads that share a KV head grouped.

    A decode query is one position, so the G = Hq / Hkv query heads of one KV head can stand as G query positions of
    that head ([B, Hkv, G, D], no causal mask) instead of asking SDPA to broadcast K/V (enable_gqa). Same result; on
    CPU the grouped form is faster in float32 and far faster in bfloat16, where SDPA's GQA path with a mask falls
    off its fast kernel.

    With `kernel` (Tandem's paged kernel bound to this step, paged_attention.py), the kernel reads K/V in place
    instead: no gather, no mask (`mask` may then be None).
    """

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 mask: torch.Tensor | None, kernel: PagedDecode | None = None):
        self.k_cache, self.v_cache = k_cache, v_cache  # [L, N, bs, Hkv, D]
        self.block_tables = block_tables  # [B, M]
        # [B, 1, 1, S], S = M * block_size: True where a key is in the context, as 0 / -inf in the cache's dtype once
        # per step (what SDPA would turn a boolean mask into in every layer's call).
        self.mask = None if mask is None else _additive(mask, k_cache.dtype)
        self.kernel = kernel

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        # q: [B, Hq, D] (k, v of this token are already in the cache)  ->  [B, Hq, D]
        if self.kernel is not None:
            return self.kernel(layer_id, q, scale)
        num_seqs, num_table_blocks = self.block_tables.shape
        _, _, block_size, num_kv_heads, head_dim = self.k_cache.shape
        num_heads = q.shape[1]
        context_shape = (num_seqs, num_table_blocks * block_size, num_kv_heads, head_dim)
        # index_select over whole blocks: on CPU several times faster than advanced indexing with the [B, M] table.
        flat_tables = self.block_tables.view(-1)  # [B * M]
        keys = self.k_cache[layer_id].index_select(0, flat_tables).view(context_shape).transpose(1, 2)  # [B, Hkv, S, D]
        values = self.v_cache[layer_id].index_select(0, flat_tables).view(context_shape).transpose(1, 2)
        if keys.dtype != q.dtype:  # a cache narrower than the model's (Config.kv_cache_dtype): widened, exactly
            keys, values = keys.to(q.dtype), values.to(q.dtype)
            if self.mask is not None and self.mask.dtype != q.dtype:
                self.mask = self.mask.to(q.dtype)
        # Query head h reads KV head h // G (Hugging Face's repeat_kv order), so the grouping is a plain view.
        grouped = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [B, Hkv, G, D]
        o = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=self.mask, scale=scale)  # [B, Hkv, G, D]
        # reshape, not view: CUDA's float32 SDPA kernels may hand back a non-contiguous [B, Hkv, G, D] (view raises
        # "view size is not compatible with input tensor's size and stride").
        return o.reshape(num_seqs, num_heads, head_dim)


class MixedAttention:
    """A chunked-prefill step on a colocated worker: the first `num_prefill_tokens` rows are prefill chunks, the
    rest one decode token per running sequence; each part goes to its own attention."""

    def __init__(self, prefill: PrefillAttention, decode: DecodeAttention, num_prefill_tokens: int):
        self.prefill, self.decode = prefill, decode
        self.num_prefill_tokens = num_prefill_tokens

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]  ->  [T, Hq, D], T = prefill tokens + decode sequences
        n = self.num_prefill_tokens
        return torch.cat((self.prefill(layer_id, q[:n], k[:n], v[:n], scale),
                          self.decode(layer_id, q[n:], k[n:], v[n:], scale)))
