"""A step's inputs, built from its sequences: the token ids, positions and cache slots of its rows, and the attention
each layer calls (attention.py) with the kernels the runner's plan names (kernel_plan.py).

Rows come in one order: prefill chunks packed first (a whole prompt, or a chunk after its cached prefix), then one row
per decoding sequence (its last token, attending to its whole cached context), then the rows that pad a compiled
CUDA step's batch to its bucket (compilation.py). Speculative verification builds the same kind of step: each
drafting sequence's [last token, drafts] as a chunk, the others as plain decodes (speculation_forward.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.attention import DecodeAttention, MixedAttention, PrefillAttention
from inference.engine.compilation import pad_num_table_blocks
from inference.engine.kernel_plan import KernelPlan
from inference.engine.kernels.paged_attention import PagedDecode
from inference.engine.kv_pool import KVPool
from inference.engine.sequence import Sequence


@dataclass(slots=True)
class Chunk:
    """Prompt rows of one sequence: `token_ids` at positions start, start + 1, ..."""
    seq: Sequence
    start: int
    token_ids: list[int]


def prefill_chunks(seqs: list[Sequence]) -> list[Chunk]:
    """Each prefilling sequence's scheduled tokens, from its first uncomputed one."""
    return [Chunk(seq, seq.num_cached_tokens,
                  seq.token_ids[seq.num_cached_tokens:seq.num_cached_tokens + seq.num_scheduled_tokens])
            for seq in seqs]


class StepInputs:
    def __init__(self, pool: KVPool, device: torch.device):
        self.pool, self.device = pool, device

    def tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def prepare(self, chunks: list[Chunk], decode: list[Sequence], plan: KernelPlan, *, num_padding: int = 0,
                pad_tables: bool = False):
        """input_ids, positions, slot_mapping ([T] each) and the attention of a step: `chunks` packed first, then one
        row per decoding sequence, then `num_padding` rows over the pool's scratch block (`pad_tables`: a compiled
        CUDA step's tables, padded to a power of two of blocks)."""
        pool = self.pool
        input_ids, positions, slots = [], [], []
        bounds, contexts = [], []
        for chunk in chunks:
            start, end = chunk.start, chunk.start + len(chunk.token_ids)
            bounds.append((len(input_ids), len(input_ids) + end - start))
            input_ids += chunk.token_ids
            positions += range(start, end)
            slots += pool.slots(chunk.seq, start, end)
            contexts.append(None if start == 0 else self.chunk_context(chunk.seq, start, end))
        num_prefill_tokens = len(input_ids)
        for seq in decode:
            # Its last token, at position num_tokens - 1, attending to all its cached tokens.
            position = seq.num_tokens - 1
            input_ids.append(seq.last_token_id)
            positions.append(position)
            slots += pool.slots(seq, position, position + 1)
        if num_padding:  # token 0 at position 0, its K/V into the scratch block (sliced off the step's output)
            input_ids += [0] * num_padding
            positions += [0] * num_padding
            slots += [pool.scratch_block * pool.block_size] * num_padding
        prefill_attention = PrefillAttention(pool.k_cache, pool.v_cache, bounds, contexts, plan.prefill_attention,
                                             torch.get_num_threads()) if chunks else None
        decode_attention = self.decode_attention(decode, plan, num_padding=num_padding,
                                                 pad_tables=pad_tables) if decode else None
        if prefill_attention and decode_attention:
            attention = MixedAttention(prefill_attention, decode_attention, num_prefill_tokens)
        else:
            attention = prefill_attention or decode_attention
        return self.tensor(input_ids), self.tensor(positions), self.tensor(slots), attention

    def chunk_context(self, seq: Sequence, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk at positions [start, end): the slots of positions [0, end) and its causal mask [1, 1, C, S]."""
        keys = torch.arange(end, device=self.device)  # [S]
        queries = torch.arange(start, end, device=self.device)  # [C]
        mask = (keys.unsqueeze(0) <= queries.unsqueeze(1)).view(1, 1, end - start, end)
        return self.tensor(self.pool.slots(seq, 0, end)), mask

    def decode_attention(self, seqs: list[Sequence], plan: KernelPlan, context_lens: list[int] | None = None,
                         num_padding: int = 0, pad_tables: bool = False) -> DecodeAttention:
        """Each sequence's last token against its context (`context_lens`: a layer draft's, past num_tokens), then
        `num_padding` rows over the scratch block, a context of one token each."""
        pool = self.pool
        bs = pool.block_size
        context_lens = context_lens or [seq.num_tokens for seq in seqs]
        # Every table is cut or padded to the blocks of the longest context; padding points at block 0, whose
        # contents torch's path reads but masks out (the kernel reads only each context's own blocks; a decode-role
        # table may be longer: it reserves the whole request).
        num_table_blocks = pad_num_table_blocks(-(-max(context_lens) // bs), self.device, pad_tables)
        tables = [(seq.block_table + [0] * num_table_blocks)[:num_table_blocks] for seq in seqs]
        tables += [[pool.scratch_block] * num_table_blocks] * num_padding
        tables = self.tensor(tables).view(len(tables), num_table_blocks)  # [B, M]
        context = self.tensor(context_lens + [1] * num_padding)  # [B]
        if plan.paged_attention is not None:  # made once here, read by every layer: no mask
            kernel = PagedDecode(plan.paged_attention, pool.k_cache, pool.v_cache, tables, context,
                                 torch.get_num_threads())
            return DecodeAttention(pool.k_cache, pool.v_cache, tables, None, kernel)
        span = torch.arange(num_table_blocks * bs, device=self.device)  # [S]
        mask = (span.unsqueeze(0) < context.unsqueeze(1))[:, None, None, :]  # [B, 1, 1, S]
        return DecodeAttention(pool.k_cache, pool.v_cache, tables, mask)
