"""The tensor ops of one single-stream decode step, counted once when the engine is built (a worker reports the
count on /info): at one token a step, what a step costs beyond reading the weights is mostly per-op overhead, so the
count shows what a change of the forward saves, on the machine where it runs."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from inference.engine.attention import DecodeAttention
from inference.engine.kernels.paged_attention import PagedDecode


class CountOps(TorchDispatchMode):
    """Counts the tensor ops (aten calls) run inside it."""

    def __init__(self):
        super().__init__()
        self.num_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.num_ops += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def count_decode_step_ops(forward, head, pool, plan) -> int:
    """Aten calls of one decode step of one sequence at position 0 (in KV block 0 of `pool`, zeroed after): the
    eager `forward` decode steps run (the lean one where built; a compiled step fuses these into fewer kernels), the
    final norm and lm_head (`head`). Sampling is left out: it depends on the request's parameters. A projection
    through Tandem's matvec kernel (matvec.py) counts as the one tensor it allocates, the paged attention kernel
    (paged_attention.py, where the kernel `plan` names it) as its own: the kernels' own work is no aten call."""
    device = pool.device
    # Three tensors, as a real step has (and a compiled graph's guards want).
    input_ids, positions, slot_mapping = (torch.zeros(1, dtype=torch.long, device=device) for _ in range(3))
    tables = torch.zeros(1, 1, dtype=torch.long, device=device)  # [B, M]
    mask = torch.zeros(1, 1, 1, pool.block_size, dtype=torch.bool, device=device)  # [B, 1, 1, S]
    mask[..., 0] = True  # the one token written
    if plan.paged_attention is not None:  # Tandem's kernel, as the runner's decode steps run it: no mask
        kernel = PagedDecode(plan.paged_attention, pool.k_cache, pool.v_cache, tables,
                             torch.ones(1, dtype=torch.long), torch.get_num_threads())
        attention = DecodeAttention(pool.k_cache, pool.v_cache, tables, None, kernel)
    else:
        attention = DecodeAttention(pool.k_cache, pool.v_cache, tables, mask)
    try:
        with CountOps() as count:
            hidden = forward(input_ids, positions, slot_mapping, attention)  # [1, hidden]
            head(hidden)
    finally:
        pool.clear_block(0)
    return count.num_ops
