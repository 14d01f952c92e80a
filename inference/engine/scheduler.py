"""Which sequences run in the next step, and what a step's sampled tokens mean. Never imports torch.

Per role:
- colocated: a step is either a prefill (waiting prompts, FIFO, under the token budget and `max_num_seqs`) or a decode
  (every running sequence, one token each). Prefill goes first, so new requests join the running batch between decode
  steps (continuous batching). A sequence that cannot get blocks waits. When a decode step lacks a block, the newest
  running sequence is preempted: its blocks are freed and it goes back to the front of the queue, to be prefilled
  again over its prompt and the tokens it already produced (recompute).
- prefill: prefill steps only; every prefilled sequence finishes at once (its K/V is exported and its blocks freed).
- decode: never prefills (the K/V comes from a prefill worker), so recompute is impossible. A received sequence is
  admitted only when blocks for its whole future (prompt + max_tokens) are free, reserved up front, so a running
  sequence never lacks a block and is never preempted. The price is admitting fewer sequences than lazy allocation
  would when many stop early; the gain is that no accepted request is ever lost or recomputed.
"""
from __future__ import annotations

from collections import deque

from inference.engine.block_manager import BlockManager
from inference.engine.sequence import Sequence, SequenceStatus
from inference.roles import Role


class Scheduler:
    def __init__(self, *, role: Role, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: frozenset[int]):
        self.role = Role(role)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_prefill_tokens_computed = 0
        self.num_generation_tokens = 0
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def num_reserved_tokens(self, seq: Sequence) -> int:
        """Decode role: the slots a sequence can ever fill (its final sampled token is never fed back)."""
        return min(seq.num_prompt_tokens + seq.params.max_tokens - 1, self.max_model_len)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Return the sequences of the next step and whether it is a prefill step (([], False) when idle)."""
        if self.role is Role.DECODE:
            self._admit_prefilled()
            return self._schedule_decode(), False
        prefill = self._schedule_prefill()
        if prefill or self.role is Role.PREFILL:
            return prefill, True
        return self._schedule_decode(), False

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], is_prefill: bool) -> None:
        """Append each sequence's sampled token and finish those that are done."""
        assert len(seqs) == len(token_ids)
        num_finished = 0
        for seq, token_id in zip(seqs, token_ids):
            if is_prefill:
                self.num_prefill_tokens_computed += seq.num_tokens - seq.num_cached_tokens
            # Every token fed in this step now has its K/V in the cache; the new one is fed by the next step.
            seq.num_cached_tokens = seq.num_tokens
            seq.append_token(token_id)
            self.num_generation_tokens += 1
            seq.finish_reason = self.finish_reason(seq)
            if seq.finish_reason is not None or self.role is Role.PREFILL:
                self._finish(seq)
                num_finished += 1
        if num_finished:
            self.running = deque(seq for seq in self.running if not seq.is_finished)

    def finish_reason(self, seq: Sequence) -> str | None:
        if not seq.params.ignore_eos and seq.last_token_id in self.eos_token_ids:
            return "stop"
        if seq.num_completion_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def abort(self, request_id: str) -> Sequence | None:
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    seq.finish_reason = "abort"
                    self._finish(seq)
                    return seq
        return None

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        num_batched_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_new_tokens = seq.num_tokens  # a preempted sequence recomputes its produced tokens too
            over_budget = num_batched_tokens + num_new_tokens > self.max_num_batched_tokens
            # FIFO: the head of the queue is never overtaken, so a long prompt cannot starve behind short ones.
            if (over_budget and scheduled) or not self.block_manager.can_allocate(num_new_tokens):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_new_tokens)
            seq.status = SequenceStatus.RUNNING
            num_batched_tokens += num_new_tokens
            scheduled.append(seq)
            self.running.append(seq)  # on the prefill role, until postprocess finishes it
        return scheduled

    def _admit_prefilled(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_reserved = self.num_reserved_tokens(seq)
            if not self.block_manager.can_allocate(num_reserved):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_reserved)
            seq.status = SequenceStatus.RUNNING
            # The model runner places the received K/V of the prompt into these blocks before this step's forward.
            seq.num_cached_tokens = seq.num_prompt_tokens
            self.running.append(seq)

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        self.running.extend(scheduled)
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        assert self.role is Role.COLOCATED, "decode reserves its blocks up front; prefill never decodes"
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        self.block_manager.deallocate(seq)
