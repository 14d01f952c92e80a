"""All device code of the engine: the model, the paged KV cache, one forward per step, K/V import and export.

The runner loads a Hugging Face causal LM and runs its own forward over the model's modules (embeddings, norms, the
q/k/v/o projections, MLPs, lm_head, and the model's own rotary module, so RoPE scaling matches Hugging Face exactly),
with attention over a paged KV cache: per layer, K and V of every token live in fixed-size blocks of one preallocated
tensor, addressed by slot = block_id * block_size + offset.
"""
from __future__ import annotations

import functools
import logging

import psutil
import torch

from inference.engine.attention import DecodeAttention, MixedAttention, PrefillAttention
from inference.engine.compilation import (compile_decode, pad_num_table_blocks, padded_batch_size, pads_decode_batch,
                                          write_kv)
from inference.engine.config import Config
from inference.engine.fusion import choose_weight_layout, file_dtype, transpose_weights
from inference.engine.gemm import kernel_projection, note as gemm_note
from inference.engine.interleave import Pause
from inference.engine.kernels.decode_layers import build as build_fused_decode
from inference.engine.kv_sizing import choose_num_blocks, default_fraction
from inference.engine.lean_decode import LeanDecoder, normed_projection, unsupported_reason as lean_unsupported_reason
from inference.engine.kernels.matvec import choose_matvec
from inference.engine.model_loading import eos_token_ids, load_model, resolve_max_model_len, zeroed_pool
from inference.engine.packed_weights import choose_packer, packed_bytes
from inference.engine.kernels.paged_attention import PagedDecode, choose_decode_attention
from inference.engine.kernels.prefill_attention import choose_prefill_attention
from inference.engine.precision import TORCH_DTYPES, choose_dtypes
from inference.engine.quantization import default_kernel, kernel_note, quantize_model, weight_bytes
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from inference.engine.step_ops import count_decode_step_ops
from inference.roles import Role

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: Config):
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device} was asked for, but this torch build or host has no CUDA")
        # The dtype that runs (config.dtype, "auto" resolved) and the KV cache's, which the KV handoff uses too
        # (precision.choose_dtypes); a KV dtype that does not suit is refused before the load.
        choice, kv_choice = choose_dtypes(config.dtype, config.kv_cache_dtype, config.model, self.device,
                                          allow_slow_float16=config.allow_slow_float16,
                                          quantization=config.quantization)
        self.dtype_name, self.dtype_reason = choice.name, choice.reason
        self.dtype = TORCH_DTYPES[self.dtype_name]
        self.kv_dtype_name, self.kv_dtype_reason = kv_choice.name, kv_choice.reason
        self.kv_dtype = TORCH_DTYPES[self.kv_dtype_name]
        self.model = load_model(config.model, self.dtype, self.device)
        int8_kernel = default_kernel(self.device, config.matvec, role=config.role) if config.quantization == "int8" else None
        self.int8_kernel = int8_kernel  # quantization.KERNELS, or None for float weights
        if int8_kernel:
            quantize_model(self.model, kernel=int8_kernel)
        self.fused_qkv = hasattr(self.model.model.layers[0].self_attn, "qkv_proj")
        # Who multiplies a decode step's tokens by the float linears (matvec.py): Tandem's kernel or torch's matmul.
        self.matvec, self.matvec_reason = choose_matvec(config.matvec, dtype=self.dtype, device=self.device,
                                                        quantization=config.quantization)
        if int8_kernel:
            self.matvec_reason += f" ({kernel_note(int8_kernel, config.matvec, role=config.role)})"
        # How the float linears' weights lie in memory (fusion.py): before the lean decoder takes them.
        self.weight_layout, self.weight_layout_reason = choose_weight_layout(
            config.weight_layout, dtype=self.dtype, device=self.device, quantization=config.quantization,
            stored=file_dtype(config.model), matvec=self.matvec is not None)
        if self.weight_layout == "transposed":
            transpose_weights(self)
            if self.matvec is not None:  # the kernel reads [out, in] rows
                self.matvec, self.matvec_reason = None, (f"{config.matvec}: torch's matmul: weight_layout "
                                                         "transposed (the kernel reads the weights as loaded)")
        self.packer, self.packed_weights_reason = choose_packer(config, self.matvec, self.dtype, self.device)
        if self.matvec is not None:
            self.matvec_reason += gemm_note(self.matvec, self.dtype, config.quantization, packed=bool(self.packer))
            log.info("matvec: %s", self.matvec_reason)
        # The final norm and lm_head: [B, hidden] -> logits [B, V], through the kernel too where it runs (lm_head is a
        # fifth of SmolLM2's weights; the kernel normalizes its input on the way in).
        self.norm_lm_head = self._norm_lm_head()
        hf = self.model.config
        self.vocab_size: int = hf.vocab_size
        self.num_layers: int = hf.num_hidden_layers
        self.num_heads: int = hf.num_attention_heads
        self.num_kv_heads: int = getattr(hf, "num_key_value_heads", None) or self.num_heads
        self.head_dim: int = getattr(hf, "head_dim", None) or hf.hidden_size // self.num_heads
        self.block_size = config.block_size
        # What the model (or --max-model-len) allows; max_model_len below is what the KV pool also holds.
        self.configured_max_model_len = resolve_max_model_len(hf, config.max_model_len)
        self.eos_token_ids = eos_token_ids(self.model)

        # 2 (K and V) x layers x block_size tokens x kv heads x head_dim elements per block.
        self.num_bytes_per_block = (2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim
                                    * self.kv_dtype.itemsize)
        self.num_blocks = self._choose_num_blocks()
        if self.num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={config.kv_cache_bytes} holds no KV block: one block of "
                             f"{self.block_size} tokens takes {self.num_bytes_per_block} bytes for this model")
        # A request longer than the pool could never run, so the context the engine offers is what the pool holds.
        self.max_model_len = min(self.configured_max_model_len, self.num_blocks * self.block_size)
        if self.max_model_len < self.configured_max_model_len:
            log.warning("the KV pool holds %d tokens, less than max_model_len %d: this engine serves a context of %d",
                        self.num_blocks * self.block_size, self.configured_max_model_len, self.max_model_len)
        # A compiled CUDA step pads its batch to a bucket (compilation.py): the padding rows write into one block past
        # those the block manager hands out (None where nothing is padded).
        self.scratch_block = self.num_blocks if pads_decode_batch(config, self.device) else None
        num_pool_blocks = self.num_blocks + (self.scratch_block is not None)
        shape = (self.num_layers, num_pool_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self.k_cache = zeroed_pool(shape, self.kv_dtype, self.device)  # [L, N, bs, Hkv, D]
        self.v_cache = zeroed_pool(shape, self.kv_dtype, self.device)  # [L, N, bs, Hkv, D]
        self.sampler = Sampler(self.device)
        # The lean decode forward (lean_decode.py): fewer ops per step, the same values as _forward.
        self.lean_decoder = None
        if config.lean_decode:
            reason = lean_unsupported_reason(self.model)
            if reason is None:
                self.lean_decoder = LeanDecoder(self)
            else:
                log.warning("lean decode: using the reference forward: %s", reason)
        self.weight_bytes = weight_bytes(self.model) + packed_bytes(self.packer)  # as held now, packed copies too
        # compile: the decode step's forward compiled and warmed up here, before the engine serves (compilation.py).
        self._compiled_decode_forward = None
        self.compile_info: dict = {"enabled": False, "backend": None, "mode": None, "warmup_s": 0.0, "fallback": None,
                                   "num_warmup_steps": 0, "pads_batch": False}
        if config.compile and config.role is Role.PREFILL:
            self.compile_info["fallback"] = "a prefill engine runs no decode step: nothing to compile"
        elif config.compile:
            self._compiled_decode_forward, self.compile_info = compile_decode(self)
        # Who computes the decode rows' attention (paged_attention.py): Tandem's kernel, reading K/V in place, or
        # torch's gather and SDPA. The `matvec` setting covers it with the linears; a compiled step keeps torch's.
        self.paged_attention, reason = choose_decode_attention(
            config.matvec, dtype=self.dtype, device=self.device, head_dim=self.head_dim,
            compiled=self._compiled_decode_forward is not None, kv_dtype=self.kv_dtype)
        self.decode_attention_info = {"kernel": "tandem" if self.paged_attention else "torch", "reason": reason}
        self.prefill_kernel, reason = choose_prefill_attention(config.matvec, dtype=self.dtype, device=self.device,
                                                               head_dim=self.head_dim, kv_dtype=self.kv_dtype)
        self.prefill_attention_info = {"kernel": "tandem" if self.prefill_kernel else "torch", "reason": reason}
        # A decode step's layers in one C call where the kernels run all of them (decode_layers.py).
        fused, self.fused_decode_reason = build_fused_decode(self)
        if self.lean_decoder is not None:
            self.lean_decoder.fused = fused
        # Whether a step can stop between layers for a prefill (interleave.py): the lean forward's can, so a decode
        # step that is not compiled, and prefill and mixed steps where lean_prefill is on.
        self.can_pause = self.lean_decoder is not None and self._compiled_decode_forward is None
        # Tensor ops of one single-stream decode step (step_ops.py); a prefill engine runs none.
        self.decode_step_ops = count_decode_step_ops(self) if config.role is not Role.PREFILL else None

    def _norm_lm_head(self):
        norm, lm_head = self.model.model.norm, kernel_projection(self.matvec, self.model.lm_head, packer=self.packer)
        if lm_head is not None and lean_unsupported_reason(self.model) is None:
            return normed_projection(lm_head, (norm.weight, norm.variance_epsilon))
        return lambda hidden, pause=None: self.model.lm_head(norm(hidden))

    def _choose_num_blocks(self) -> int:
        """Explicit kv_cache_bytes as given; "auto" from the memory free now that the weights are loaded."""
        config = self.config
        if config.kv_cache_bytes != "auto":
            return config.kv_cache_bytes // self.num_bytes_per_block
        if self.device.type == "cuda":
            num_free_bytes = torch.cuda.mem_get_info(self.device)[0]
        else:
            num_free_bytes = psutil.virtual_memory().available
        fraction = config.kv_memory_fraction or default_fraction(self.device.type)
        if config.kv_memory_budget is not None:
            # The share the placer handed this worker; never more than is free now.
            num_free_bytes, fraction = min(config.kv_memory_budget, num_free_bytes), 1.0
        choice = choose_num_blocks(
            num_free_bytes=num_free_bytes, fraction=fraction,
            num_bytes_per_block=self.num_bytes_per_block, block_size=self.block_size,
            max_model_len=self.configured_max_model_len, max_num_seqs=config.max_num_seqs)
        budget = ("this worker's share of the host's KV budget" if config.kv_memory_budget is not None
                  else "free")
        log.info("KV pool (auto): %d blocks of %d tokens = %.1f MiB (%s; %.2f of %.1f MiB %s on %s)",
                 choice.num_blocks, self.block_size, choice.num_blocks * self.num_bytes_per_block / (1 << 20),
                 choice.reason, choice.fraction, num_free_bytes / (1 << 20), budget, self.device.type)
        return choice.num_blocks

    @property
    def kv_layout(self) -> dict:
        return {"num_layers": self.num_layers, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "dtype": self.kv_dtype_name, "block_size": self.block_size}

    def validate_kv(self, k, v, num_prompt_tokens: int) -> None:
        """Raise ValueError unless k and v are this engine's K/V for a prompt of `num_prompt_tokens` tokens."""
        expected = (self.num_layers, num_prompt_tokens, self.num_kv_heads, self.head_dim)
        for name, tensor in (("k", k), ("v", v)):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{name} has shape {list(tensor.shape)}, expected {list(expected)} "
                                 "([num_layers, num_prompt_tokens, num_kv_heads, head_dim])")
            if tensor.dtype != self.kv_dtype:
                raise ValueError(f"{name} has dtype {str(tensor.dtype).removeprefix('torch.')}, "
                                 f"expected {self.kv_dtype_name}")

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool, pause: Pause | None = None) -> list[int | None]:
        """One step: each sequence's scheduled tokens (a whole prompt, a prefill chunk, or its one decode token) in
        one forward. A prefill step lists its prefill chunks first, then any decodes (a mixed chunked step). `pause`:
        the step may stop between layers for a prefill (interleave.py; the lean forward's steps only).

        Returns, per sequence, the sampled token id, or None for a chunk that does not reach the end of its tokens.
        """
        if is_prefill:
            num_prefill = sum(1 for seq in seqs if seq.is_prefilling)
            assert all(seq.is_prefilling for seq in seqs[:num_prefill]), "prefill chunks come before decodes"
            prefill, decode = seqs[:num_prefill], seqs[num_prefill:]
        else:
            self._import_kv(seqs)
            prefill, decode = [], seqs
        input_ids, positions, slot_mapping, attention = self._prepare(prefill, decode)
        if prefill:  # the lean forward where it is built and on for prefill (exact), else the reference
            forward = self.lean_decoder.forward if self.lean_decoder and self.config.lean_prefill else self._forward
        else:
            forward = self._compiled_decode_forward or (self.lean_decoder.forward if self.lean_decoder
                                                        else self._forward)
        if pause is not None and self.lean_decoder is not None and forward == self.lean_decoder.forward:
            forward = functools.partial(forward, pause=pause)
        else:
            pause = None
        hidden = forward(input_ids, positions, slot_mapping, attention)  # [T, hidden]
        # Logits only at the last position of each sequence that samples (decodes, and chunks that end a prompt).
        sampling = [seq for seq in seqs if seq.samples_next_token]
        if len(sampling) != hidden.shape[0]:
            last_rows, row = [], 0
            for seq in seqs:
                row += seq.num_scheduled_tokens
                if seq.samples_next_token:
                    last_rows.append(row - 1)
            hidden = hidden.index_select(0, self._tensor(last_rows))  # [B, hidden]
        token_ids = iter(self._sample(hidden, sampling, pause) if sampling else [])
        if is_prefill and self.config.role is Role.PREFILL:
            self._export_kv([seq for seq in prefill if seq.samples_next_token])
        return [next(token_ids) if seq.samples_next_token else None for seq in seqs]

    def _sample(self, hidden: torch.Tensor, sampling: list[Sequence], pause: Pause | None) -> list[int]:
        """The LM head and the sampler over the step's sampling rows. A step that may pause looks at the arrivals
        flag after its last layer, between the head's parts (where Tandem's kernel runs it) and before sampling: the
        tail of a decode step (a sizeable share of a small model's step of a few streams) is no longer a stretch that
        an arrival waits out."""
        if pause is None:
            return self.sampler(self.norm_lm_head(hidden).float(), sampling)
        pause.check()
        logits = self.norm_lm_head(hidden, pause).float()
        pause.check()
        return self.sampler(logits, sampling)

    # -- inputs ---------------------------------------------------------------------------------------------------

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[i // bs] * bs + i % bs for i in range(start, end)]

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def _prepare(self, prefill: list[Sequence], decode: list[Sequence]):
        """input_ids, positions, slot_mapping ([T] each) and the attention of a step: prefill chunks packed first,
        then one row per decoding sequence."""
        input_ids, positions, slots = [], [], []
        bounds, contexts = [], []
        for seq in prefill:
            start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
            bounds.append((len(input_ids), len(input_ids) + end - start))
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += self._slots(seq, start, end)
            contexts.append(None if start == 0 else self._chunk_context(seq, start, end))
        num_prefill_tokens = len(input_ids)
        for seq in decode:
            # Its last token, at position num_tokens - 1, attending to all its cached tokens.
            position = seq.num_tokens - 1
            input_ids.append(seq.last_token_id)
            positions.append(position)
            slots += self._slots(seq, position, position + 1)
        num_padding = self._num_padding_rows(prefill, decode)
        if num_padding:  # token 0 at position 0, its K/V into the scratch block (sliced off the step's output)
            input_ids += [0] * num_padding
            positions += [0] * num_padding
            slots += [self.scratch_block * self.block_size] * num_padding
        prefill_attention = PrefillAttention(self.k_cache, self.v_cache, bounds, contexts, self.prefill_kernel,
                                             torch.get_num_threads()) if prefill else None
        decode_attention = self._decode_attention(decode, num_padding=num_padding) if decode else None
        if prefill_attention and decode_attention:
            attention = MixedAttention(prefill_attention, decode_attention, num_prefill_tokens)
        else:
            attention = prefill_attention or decode_attention
        return self._tensor(input_ids), self._tensor(positions), self._tensor(slots), attention

    def _chunk_context(self, seq: Sequence, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk at positions [start, end): the slots of positions [0, end) and its causal mask [1, 1, C, S]."""
        keys = torch.arange(end, device=self.device)  # [S]
        queries = torch.arange(start, end, device=self.device)  # [C]
        mask = (keys.unsqueeze(0) <= queries.unsqueeze(1)).view(1, 1, end - start, end)
        return self._tensor(self._slots(seq, 0, end)), mask

    def _num_padding_rows(self, prefill: list[Sequence], decode: list[Sequence]) -> int:
        """Rows that pad a compiled CUDA decode step's batch to its bucket (compilation.padded_batch_size)."""
        if prefill or not decode or self.scratch_block is None or self._compiled_decode_forward is None:
            return 0
        return padded_batch_size(len(decode)) - len(decode)

    def _decode_attention(self, seqs: list[Sequence], context_lens: list[int] | None = None,
                          num_padding: int = 0) -> DecodeAttention:
        """Each sequence's last token against its context (`context_lens`: a layer draft's, past num_tokens), then
        `num_padding` rows over the scratch block, a context of one token each."""
        bs = self.block_size
        context_lens = context_lens or [seq.num_tokens for seq in seqs]
        # Every table is cut or padded to the blocks of the longest context; padding points at block 0, whose
        # contents torch's path reads but masks out (the kernel reads only each context's own blocks; a decode-role
        # table may be longer: it reserves the whole request).
        num_table_blocks = pad_num_table_blocks(-(-max(context_lens) // bs), self.device,
                                                self._compiled_decode_forward is not None)
        tables = [(seq.block_table + [0] * num_table_blocks)[:num_table_blocks] for seq in seqs]
        tables += [[self.scratch_block] * num_table_blocks] * num_padding
        tables = self._tensor(tables).view(len(tables), num_table_blocks)  # [B, M]
        context = self._tensor(context_lens + [1] * num_padding)  # [B]
        if self.paged_attention is not None:  # made once here, read by every layer: no mask
            kernel = PagedDecode(self.paged_attention, self.k_cache, self.v_cache, tables, context,
                                 torch.get_num_threads())
            return DecodeAttention(self.k_cache, self.v_cache, tables, None, kernel)
        span = torch.arange(num_table_blocks * bs, device=self.device)  # [S]
        mask = (span.unsqueeze(0) < context.unsqueeze(1))[:, None, None, :]  # [B, 1, 1, S]
        return DecodeAttention(self.k_cache, self.v_cache, tables, mask)

    # -- forward --------------------------------------------------------------------------------------------------

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                 attention, num_layers: int | None = None) -> torch.Tensor:
        # input_ids, positions, slot_mapping: [T]  ->  hidden: [T, hidden]
        # num_layers: the first layers only (a speculative layer draft), else all of them.
        model = self.model.model
        num_tokens = input_ids.shape[0]
        h_q, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = model.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = model.rotary_emb(x, positions.unsqueeze(0))  # [1, T, D] each
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, D]
        k_slots = self.k_cache.view(self.num_layers, -1, h_kv, d)  # [L, N*bs, Hkv, D]
        v_slots = self.v_cache.view(self.num_layers, -1, h_kv, d)
        for layer_id, layer in enumerate(model.layers[:num_layers]):
            attn = layer.self_attn
            h = layer.input_layernorm(x)  # [T, hidden]
            if self.fused_qkv:  # int8: one projection for q, k and v (quantization.py)
                q, k, v = attn.qkv_proj(h).split((h_q * d, h_kv * d, h_kv * d), dim=-1)
                q, k, v = q.view(num_tokens, h_q, d), k.view(num_tokens, h_kv, d), v.view(num_tokens, h_kv, d)
            else:
                q = attn.q_proj(h).view(num_tokens, h_q, d)  # [T, Hq, D]
                k = attn.k_proj(h).view(num_tokens, h_kv, d)  # [T, Hkv, D]
                v = attn.v_proj(h).view(num_tokens, h_kv, d)  # [T, Hkv, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if torch.compiler.is_compiling():  # one opaque op, written in place (compilation.write_kv)
                write_kv(self.k_cache, self.v_cache, layer_id, slot_mapping, k, v)
            else:
                narrow = self.kv_dtype != self.dtype  # rounded once on the way into a narrower cache
                k_slots[layer_id].index_copy_(0, slot_mapping, k.to(self.kv_dtype) if narrow else k)
                v_slots[layer_id].index_copy_(0, slot_mapping, v.to(self.kv_dtype) if narrow else v)
            o = attention(layer_id, q, k, v, attn.scaling)  # [T, Hq, D]
            x = x + attn.o_proj(o.reshape(num_tokens, h_q * d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def clear_block(self, block_id: int) -> None:
        """Zero one KV block in every layer (after the compile warm-up wrote into it)."""
        self.k_cache[:, block_id].zero_()
        self.v_cache[:, block_id].zero_()

    # -- KV handoff -----------------------------------------------------------------------------------------------

    def _export_kv(self, seqs: list[Sequence]) -> None:
        """Prefill role: copy each prompt's K/V out as [num_layers, num_prompt_tokens, num_kv_heads, head_dim] (CPU)."""
        k_slots = self.k_cache.view(self.num_layers, -1, self.num_kv_heads, self.head_dim)
        v_slots = self.v_cache.view(self.num_layers, -1, self.num_kv_heads, self.head_dim)
        for seq in seqs:
            slots = self._tensor(self._slots(seq, 0, seq.num_prompt_tokens))  # [P]
            seq.kv_export = (k_slots.index_select(1, slots).cpu().contiguous(),
                             v_slots.index_select(1, slots).cpu().contiguous())

    def _import_kv(self, seqs: list[Sequence]) -> None:
        """Decode role: place received prompt K/V into the blocks the scheduler just reserved."""
        k_slots = self.k_cache.view(self.num_layers, -1, self.num_kv_heads, self.head_dim)
        v_slots = self.v_cache.view(self.num_layers, -1, self.num_kv_heads, self.head_dim)
        for seq in seqs:
            if seq.kv_import is None:
                continue
            k, v = seq.kv_import  # [L, P, Hkv, D] each, validated at add_prefilled
            slots = self._tensor(self._slots(seq, 0, seq.num_prompt_tokens))  # [P]
            k_slots.index_copy_(1, slots, k.to(self.device, non_blocking=True))
            v_slots.index_copy_(1, slots, v.to(self.device, non_blocking=True))
            seq.kv_import = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    # x: [..., D] -> [..., D], (x1, x2) -> (-x2, x1) as in Hugging Face's Llama
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
