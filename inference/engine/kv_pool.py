"""The paged KV cache of one runner: how many blocks it gets, its two tensors, and K/V in and out of it.

Per layer, K and V of every token live in fixed-size blocks of one preallocated tensor each, [L, N, bs, Hkv, D],
addressed by slot = block_id * block_size + offset; the block manager (block_manager.py, torch-free) hands the blocks
out, this module holds what they address.

- Size: explicit `kv_cache_bytes` as given; "auto" from the memory free once the weights are loaded (kv_sizing.py),
  or this worker's share of its host's KV budget. The context the engine offers is what the pool holds: a request
  longer than the pool could never run.
- A compiled CUDA step pads its batch to a bucket (compilation.py): the padding rows write into one block past those
  the block manager hands out (`scratch_block`, None where nothing is padded).
- The KV handoff: a prefill engine copies each prompt's K/V out, a decode engine places what it received into the
  blocks the scheduler reserved (checked first by `validate_kv`).
"""
from __future__ import annotations

import logging

import psutil
import torch

from inference.engine.config import Config
from inference.engine.kv_sizing import choose_num_blocks, default_fraction
from inference.engine.model_loading import ModelShape, zeroed_pool
from inference.engine.sequence import Sequence

log = logging.getLogger(__name__)


class KVPool:
    def __init__(self, config: Config, shape: ModelShape, kv_dtype: torch.dtype, kv_dtype_name: str,
                 device: torch.device, *, configured_max_model_len: int, padded: bool):
        self.config, self.shape, self.device = config, shape, device
        self.kv_dtype, self.kv_dtype_name = kv_dtype, kv_dtype_name
        self.block_size = config.block_size
        # What the model (or --max-model-len) allows; max_model_len below is what the pool also holds.
        self.configured_max_model_len = configured_max_model_len
        # 2 (K and V) x layers x block_size tokens x kv heads x head_dim elements per block.
        self.num_bytes_per_block = (2 * shape.num_layers * self.block_size * shape.num_kv_heads * shape.head_dim
                                    * kv_dtype.itemsize)
        self.num_blocks = self._choose_num_blocks()
        if self.num_blocks < 1:
            raise ValueError(f"kv_cache_bytes={config.kv_cache_bytes} holds no KV block: one block of "
                             f"{self.block_size} tokens takes {self.num_bytes_per_block} bytes for this model")
        self.max_model_len = min(configured_max_model_len, self.num_blocks * self.block_size)
        if self.max_model_len < configured_max_model_len:
            log.warning("the KV pool holds %d tokens, less than max_model_len %d: this engine serves a context of %d",
                        self.num_blocks * self.block_size, configured_max_model_len, self.max_model_len)
        self.scratch_block = self.num_blocks if padded else None
        num_pool_blocks = self.num_blocks + (self.scratch_block is not None)
        pool_shape = (shape.num_layers, num_pool_blocks, self.block_size, shape.num_kv_heads, shape.head_dim)
        self.k_cache = zeroed_pool(pool_shape, kv_dtype, device)  # [L, N, bs, Hkv, D]
        self.v_cache = zeroed_pool(pool_shape, kv_dtype, device)  # [L, N, bs, Hkv, D]

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
        shape = self.shape
        return {"num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                "dtype": self.kv_dtype_name, "block_size": self.block_size}

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The cache slots of positions [start, end) of `seq`."""
        bs, table = self.block_size, seq.block_table
        return [table[i // bs] * bs + i % bs for i in range(start, end)]

    def clear_block(self, block_id: int) -> None:
        """Zero one KV block in every layer (after the compile warm-up wrote into it)."""
        self.k_cache[:, block_id].zero_()
        self.v_cache[:, block_id].zero_()

    # -- the KV handoff -----------------------------------------------------------------------------------------

    def validate_kv(self, k, v, num_prompt_tokens: int) -> None:
        """Raise ValueError unless k and v are this engine's K/V for a prompt of `num_prompt_tokens` tokens."""
        shape = self.shape
        expected = (shape.num_layers, num_prompt_tokens, shape.num_kv_heads, shape.head_dim)
        for name, tensor in (("k", k), ("v", v)):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{name} has shape {list(tensor.shape)}, expected {list(expected)} "
                                 "([num_layers, num_prompt_tokens, num_kv_heads, head_dim])")
            if tensor.dtype != self.kv_dtype:
                raise ValueError(f"{name} has dtype {str(tensor.dtype).removeprefix('torch.')}, "
                                 f"expected {self.kv_dtype_name}")

    def _slot_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.shape.num_layers, -1, self.shape.num_kv_heads, self.shape.head_dim)
        return self.k_cache.view(shape), self.v_cache.view(shape)  # [L, N*bs, Hkv, D] each

    def _prompt_slots(self, seq: Sequence) -> torch.Tensor:
        slots = self.slots(seq, 0, seq.num_prompt_tokens)
        return torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)  # [P]

    def export_kv(self, seqs: list[Sequence]) -> None:
        """Prefill role: copy each prompt's K/V out as [num_layers, num_prompt_tokens, num_kv_heads, head_dim] (CPU)."""
        k_slots, v_slots = self._slot_views()
        for seq in seqs:
            slots = self._prompt_slots(seq)
            seq.kv_export = (k_slots.index_select(1, slots).cpu().contiguous(),
                             v_slots.index_select(1, slots).cpu().contiguous())

    def import_kv(self, seqs: list[Sequence]) -> None:
        """Decode role: place received prompt K/V into the blocks the scheduler just reserved."""
        k_slots, v_slots = self._slot_views()
        for seq in seqs:
            if seq.kv_import is None:
                continue
            k, v = seq.kv_import  # [L, P, Hkv, D] each, validated at add_prefilled
            slots = self._prompt_slots(seq)
            k_slots.index_copy_(1, slots, k.to(self.device, non_blocking=True))
            v_slots.index_copy_(1, slots, v.to(self.device, non_blocking=True))
            seq.kv_import = None
