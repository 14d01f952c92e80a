"""How many KV blocks an engine gets when `kv_cache_bytes` is "auto". Never imports torch: the model runner measures
the memory, this module only does the arithmetic.

The rule follows vLLM's `gpu_memory_utilization`: a fraction of the memory that is free once the weights are loaded
(free GPU memory on CUDA, the host's available memory on CPU), or all of the budget a placer handed the worker
(`kv_memory_budget`: the node agent divides a CPU host's KV budget among the workers it runs there), then clamped:
1. at least one full context (max_model_len tokens), so that any request the model admits fits an empty pool, as
   long as that takes at most MAX_FRACTION_FOR_ONE_CONTEXT of the free memory;
2. at most max_num_seqs full contexts: the scheduler never runs more sequences than that, so more blocks stay idle.
When even one full context does not fit, the pool is what the fraction allows, and the engine's effective
max_model_len shrinks to what it holds.
"""
from __future__ import annotations

from dataclasses import dataclass

# The default fraction of free memory per device type. A CPU host also runs the OS, the tokenizers and often several
# workers, and gains little from a big pool (compute, not KV space, limits a CPU batch); a GPU is the worker's own.
DEFAULT_KV_MEMORY_FRACTION = {"cpu": 0.2, "cuda": 0.8}
# Lower clamp's ceiling: one full context may take more than the fraction, but never more than this share of memory.
MAX_FRACTION_FOR_ONE_CONTEXT = 0.9


@dataclass(frozen=True, slots=True)
class KVPoolChoice:
    num_blocks: int
    fraction: float
    num_free_bytes: int
    reason: str  # which rule decided: "fraction", "one full context", "max_num_seqs full contexts"


def default_fraction(device_type: str) -> float:
    return DEFAULT_KV_MEMORY_FRACTION.get(device_type, DEFAULT_KV_MEMORY_FRACTION["cuda"])


def choose_num_blocks(*, num_free_bytes: int, fraction: float, num_bytes_per_block: int, block_size: int,
                      max_model_len: int, max_num_seqs: int) -> KVPoolChoice:
    num_blocks_per_context = -(-max_model_len // block_size)
    num_blocks = int(num_free_bytes * fraction) // num_bytes_per_block
    reason = "fraction"
    max_blocks = num_blocks_per_context * max_num_seqs
    if num_blocks > max_blocks:
        num_blocks, reason = max_blocks, "max_num_seqs full contexts"
    elif num_blocks < num_blocks_per_context:
        affordable = int(num_free_bytes * MAX_FRACTION_FOR_ONE_CONTEXT) // num_bytes_per_block
        if affordable >= num_blocks_per_context:
            num_blocks, reason = num_blocks_per_context, "one full context"
    return KVPoolChoice(num_blocks=num_blocks, fraction=fraction, num_free_bytes=num_free_bytes, reason=reason)
