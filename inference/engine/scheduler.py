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

Chunked prefill (colocated and prefill roles, `chunked_prefill=True`): a step feeds at most its step budget of
tokens, which depends on what shares the step. On colocated, every running sequence past its prefill decodes one
token and the rest of `step_token_budget` (the chunk beside decodes, small: it is what each stream's inter-token
latency waits for) goes to prefill chunks, all in one forward (a mixed batch), so a long prompt no longer stalls the
running streams for its whole prefill. A step with no decode in it (a prefill worker's always; a colocated one's
while no stream is past its prefill) has `step_token_budget_alone`, larger: no stream waits on it, and each chunk
costs a pass over the weights, so small chunks alone would only make long prompts slower (measured in
docs/performance.md); it stays bounded so that a short prompt arriving behind a long one waits for one such chunk,
not the whole prompt. A sequence holds blocks for all its tokens from its first chunk on and stays RUNNING while
partly prefilled; only the chunk that reaches its last token samples. Preempting a partly prefilled sequence frees
its blocks and it starts over (recompute), like any other.

Which prompts get the prefill budget: shortest remaining prefill first, with aging. Candidates (partly prefilled
sequences and waiting ones) are ordered by their uncached tokens minus this step's budget per step they waited in
vain (`num_steps_starved`); each gets min(what it needs, what is left), except that a partial chunk never follows a
prompt that completes in the same step (it would only make that step, and so that prompt's first token, later). So
a 20-token prompt goes before the rest of a 2,000-token one, in a step of its own size, and the long one gets the
whole budget of the steps between; if short prompts ever take every step, the long one's key falls by a budget per
step until it leads: it waits at most about remaining / step_token_budget steps for a chunk (fewer where the steps
have the larger budget). Admission stops at the first candidate, in that order, that cannot get blocks, so aging
also protects a long prompt from being overtaken forever when KV memory is short.

Which waiting sequence goes first, and whether it may join the running batch now (priority bands with aging, the
tenant holding fewest, the ITL objective's batch limit): admission_order.py, which this class extends.

Prefix caching (block_manager.py, prefix_cache.py): a waiting sequence is admitted after the cached prefix it would
start from (its token budget and its place among the candidates count only the rest), and postprocess keys the
blocks each step filled.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable

from inference.engine.admission_order import PRIORITY_AGING_S, AdmissionOrder
from inference.engine.batch_limit import DecodeStepTimes
from inference.engine.block_manager import BlockManager
from inference.engine.sequence import Sequence, SequenceStatus
from inference.roles import Role



class Scheduler(AdmissionOrder):
    def __init__(self, *, role: Role, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: frozenset[int], chunked_prefill: bool = False,
                 prefill_chunk_size: int | None = None, prefill_chunk_size_alone: int | None = None,
                 priority_aging_s: float = PRIORITY_AGING_S, clock: Callable[[], float] = time.monotonic):
        self.role = Role(role)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.chunked_prefill = chunked_prefill and self.role is not Role.DECODE
        # Chunked mode: the most tokens one step feeds, decode and prefill tokens together, beside running decodes
        # and in a step without any (None: the same as beside decodes).
        self.step_token_budget = min(max_num_batched_tokens, prefill_chunk_size or max_num_batched_tokens)
        self.step_token_budget_alone = max(self.step_token_budget,
                                           min(max_num_batched_tokens, prefill_chunk_size_alone or 0))
        self.priority_aging_s, self.clock = priority_aging_s, clock
        self.num_batched_tokens = 0  # tokens the last scheduled step feeds (prefill and decode together)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_prefill_tokens_computed = 0
        self.num_generation_tokens = 0
        self.num_preemptions = 0
        # The deployment's ITL objective bounds the decode batch (batch_limit.py): what admission lets run now.
        self.step_times = DecodeStepTimes()
        self.seq_limit = max_num_seqs
        self._room: tuple[int, Counter[bytes], int] | None = None  # _has_room's counts, for this many running

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        seq.queued_at = self.clock()
        self.waiting.append(seq)

    def num_reserved_tokens(self, seq: Sequence) -> int:
        """Decode role: the slots a sequence can ever fill (its final sampled token is never fed back)."""
        return min(seq.num_prompt_tokens + seq.params.max_tokens - 1, self.max_model_len)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Return the sequences of the next step and whether it is a prefill step (([], False) when idle)."""
        self.seq_limit = (self.step_times.limit(self.itl_target_s(), self.max_num_seqs)
                          if self.role is not Role.PREFILL else self.max_num_seqs)
        self._room = None
        seqs, is_prefill = self._schedule()
        self.num_batched_tokens = sum(seq.num_scheduled_tokens for seq in seqs)
        return seqs, is_prefill

    def _prefill_tokens(self, num_decodes: int, most: int, *, own_pass: bool = False) -> int:
        """The prompt tokens a step beside `num_decodes` running streams takes at most: `most`, less where the
        deployment's ITL objective leaves less (batch_limit.py)."""
        return self.step_times.prefill_tokens(self.itl_target_s(), num_decodes, most, own_pass=own_pass)

    def _schedule(self) -> tuple[list[Sequence], bool]:
        if self.role is Role.DECODE:
            self._admit_prefilled()
            return self._schedule_decode(), False
        if self.chunked_prefill:
            decode = self._schedule_decode() if self.role is Role.COLOCATED else []
            budget = (len(decode) + self._prefill_tokens(len(decode), self.step_token_budget - len(decode))
                      if decode else self.step_token_budget_alone)
            prefill = self._schedule_chunks(budget, num_decode_tokens=len(decode))
            return prefill + decode, bool(prefill)  # prefill chunks first, then the decodes
        prefill = self._schedule_prefill()
        if prefill or self.role is Role.PREFILL:
            return prefill, True
        return self._schedule_decode(), False

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | list[int] | None], is_prefill: bool) -> None:
        """Append each sequence's sampled token and finish those that are done. A partial prefill chunk samples
        nothing (its token id is None): its tokens are cached, and the sequence waits for its next chunk. A
        speculative decode step gives a list (accepted drafts, then the model's own token): they are appended in
        order up to the first that finishes the sequence, each but the last having been fed (its K/V cached)."""
        assert len(seqs) == len(token_ids)
        num_finished = 0
        for seq, token_id in zip(seqs, token_ids):
            if seq.is_prefilling:
                self.num_prefill_tokens_computed += seq.num_scheduled_tokens
            # Every token fed in this step now has its K/V in the cache; a new one is fed by the next step.
            seq.num_cached_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.cache_full_blocks(seq)  # prefix caching: blocks this step filled
            if token_id is None:
                assert seq.num_cached_tokens < seq.num_tokens, f"{seq} completed its prefill but sampled nothing"
                continue
            assert seq.num_cached_tokens == seq.num_tokens, f"{seq} sampled before its prefill completed"
            seq.is_prefilling = False
            for i, new_token_id in enumerate(token_id if isinstance(token_id, list) else [token_id]):
                seq.num_cached_tokens += 1 if i else 0  # the accepted draft before this one was fed
                seq.append_token(new_token_id)
                self.num_generation_tokens += 1
                seq.finish_reason = self.finish_reason(seq)
                if seq.finish_reason is not None:
                    break
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
        if len(self.running) >= self.max_num_seqs:
            return []  # no room: spare the sort of the waiting queue
        scheduled: list[Sequence] = []
        num_batched_tokens = 0
        for seq in self._by_priority():
            if not self._has_room(seq):
                continue
            # A preempted sequence recomputes its produced tokens too; a cached prefix is not computed.
            num_new_tokens = self._num_uncached(seq)
            over_budget = num_batched_tokens + num_new_tokens > self.max_num_batched_tokens
            # FIFO within a band: its head is never overtaken, so a long prompt cannot starve behind short ones.
            if (over_budget and scheduled) or not self.block_manager.can_allocate(seq.num_tokens, seq):
                break
            self.waiting.remove(seq)
            self.block_manager.allocate(seq, seq.num_tokens)
            seq.status = SequenceStatus.RUNNING
            seq.num_scheduled_tokens = num_new_tokens = seq.num_uncached_tokens
            num_batched_tokens += num_new_tokens
            scheduled.append(seq)
            self.running.append(seq)  # on the prefill role, until postprocess finishes it
        return scheduled

    def schedule_between(self, num_leaving: int, num_tokens_used: int = 0,
                         outranking: Sequence | None = None) -> list[Sequence]:
        """A prefill to run between the layers of a paused step (interleave.py), colocated role: waiting sequences,
        best band first, then the tenant holding fewest (then in the order their mode takes them: FIFO, or shortest
        first), whose whole uncached prompt fits what is left of the budget (the prefill token budget, or in chunked
        mode the chunk beside decodes, so that the running streams wait no longer than in a mixed step), while the
        running batch less the `num_leaving` sequences that its aborts free when the step ends has room. The budget is
        the paused step's, whatever the number of pauses: `num_tokens_used` of it went to earlier ones. One tenant's
        requests (of one band) per prefill, the first's: a quiet tenant's first token does not wait for a flood's
        resumed streams prefilled beside it (which would delay it well past a prefill alone); the
        others wait for the next pause or the next step's start. `outranking`: a prefill of this kind is running (this
        one pauses it): only requests that outrank it go in (a better band, or its band and a tenant holding fewer
        sequences): a quiet tenant's request is not kept waiting by a flood's prefill that started just before it,
        nor the reverse. Each completes its prefill here. Sequences of the paused step are untouched: their blocks
        were appended before the step."""
        self.num_batched_tokens = 0
        self._room = None
        if (self.role is not Role.COLOCATED or not self.waiting
                or len(self.running) - num_leaving >= self.max_num_seqs):
            return []  # no room: spare the sort (a step's start asks this beside a full batch every step)
        budget = (self._prefill_tokens(sum(not seq.is_prefilling for seq in self.running), self.step_token_budget,
                                       own_pass=True)
                  if self.chunked_prefill else self.max_num_batched_tokens) - num_tokens_used
        now, holding, floor = self.clock(), self._holding(), self._floor(self.waiting)
        uncached = {id(seq): self._num_uncached(seq) for seq in self.waiting}
        order = ((lambda seq: (self.band(seq, now, floor), holding[seq.cache_salt], uncached[id(seq)]))
                 if self.chunked_prefill else (lambda seq: (self.band(seq, now, floor), holding[seq.cache_salt])))
        scheduled: list[Sequence] = []
        first = None  # (band, tenant) of the first taken: one tenant's requests per prefill
        bar = (None if outranking is None
               else (self.band(outranking, now, floor), holding[outranking.cache_salt]))
        for seq in sorted(self.waiting, key=order):
            if not self._has_room(seq, num_leaving):
                continue
            if first is not None and (self.band(seq, now, floor), seq.cache_salt) != first:
                continue
            if bar is not None and (self.band(seq, now, floor), holding[seq.cache_salt]) >= bar:
                continue
            if (uncached[id(seq)] > budget - sum(s.num_scheduled_tokens for s in scheduled)
                    or not self.block_manager.can_allocate(seq.num_tokens, seq)):
                if self.chunked_prefill:
                    continue  # its chunks come at the step's end, as before
                break  # FIFO within a band: the head is not overtaken
            first = first or (self.band(seq, now, floor), seq.cache_salt)
            self.waiting.remove(seq)
            self.block_manager.allocate(seq, seq.num_tokens)
            seq.status = SequenceStatus.RUNNING
            # An eviction by an earlier admission here may have shortened its cached prefix: a few tokens more.
            seq.num_scheduled_tokens = seq.num_uncached_tokens
            scheduled.append(seq)
            self.running.append(seq)
        self.num_batched_tokens = sum(seq.num_scheduled_tokens for seq in scheduled)
        return scheduled

    def _admit_prefilled(self) -> None:
        if len(self.running) >= self.max_num_seqs:
            return  # no room: spare the sort of the waiting queue
        for seq in self._by_priority():
            if not self._has_room(seq):
                continue
            num_reserved = self.num_reserved_tokens(seq)
            if not self.block_manager.can_allocate(num_reserved):
                break
            self.waiting.remove(seq)
            self.block_manager.allocate(seq, num_reserved)
            seq.status = SequenceStatus.RUNNING
            # The model runner places the received K/V of the prompt into these blocks before this step's forward.
            seq.num_cached_tokens = seq.num_prompt_tokens
            seq.is_prefilling = False
            self.running.append(seq)

    def _schedule_chunks(self, step_budget: int, *, num_decode_tokens: int) -> list[Sequence]:
        """Give what the decodes leave of `step_budget` to partly prefilled and waiting sequences, best band first,
        then shortest remaining first with aging (see the module docstring). Returns them in that order, each with
        its num_scheduled_tokens."""
        budget = step_budget - num_decode_tokens
        candidates = [seq for seq in self.running if seq.is_prefilling] + list(self.waiting)
        uncached = {id(seq): self._num_uncached(seq) for seq in candidates}
        now, holding, floor = self.clock(), self._holding(), self._floor(candidates)
        # A partly prefilled sequence is running: its tenant's other sequences are what it holds beside it.
        candidates.sort(key=lambda seq: (self.band(seq, now, floor), holding[seq.cache_salt] - seq.is_prefilling,
                                         uncached[id(seq)] - seq.num_steps_starved * step_budget))
        scheduled: list[Sequence] = []
        admitting = True
        for seq in candidates:
            num_tokens = min(uncached[id(seq)], budget)
            if num_tokens <= 0:
                break
            if num_tokens < uncached[id(seq)] and any(s.samples_next_token for s in scheduled):
                # A partial chunk behind a prompt that completes here would only delay that prompt's first token.
                continue
            if seq.status is SequenceStatus.WAITING:
                if not self._has_room(seq):
                    continue
                admitting = admitting and self.block_manager.can_allocate(seq.num_tokens, seq)
                if not admitting:
                    continue
                self.waiting.remove(seq)
                self.block_manager.allocate(seq, seq.num_tokens)  # a preempted sequence recomputes its produced tokens
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                # An eviction by an earlier admission of this step may have shortened its cached prefix.
                num_tokens = min(seq.num_uncached_tokens, budget)
            seq.num_scheduled_tokens = num_tokens
            budget -= num_tokens
            scheduled.append(seq)
        for seq in candidates:
            seq.num_steps_starved = 0 if seq.num_scheduled_tokens else seq.num_steps_starved + 1
        return scheduled

    def _num_uncached(self, seq: Sequence) -> int:
        """The tokens `seq` has yet to prefill: for a waiting one, all but the cached prefix it would start from."""
        if seq.status is SequenceStatus.WAITING:
            return seq.num_tokens - self.block_manager.num_cached_prefix_tokens(seq)
        return seq.num_uncached_tokens

    def _schedule_decode(self) -> list[Sequence]:
        """One token for each running sequence past its prefill. When one lacks a block, the newest running
        sequence (a partly prefilled one too) is preempted, down to the sequence itself."""
        running = list(self.running)
        scheduled: list[Sequence] = []
        i = 0
        while i < len(running):
            seq = running[i]
            if seq.is_prefilling:  # chunked mode: its next chunk is scheduled by _schedule_chunks
                i += 1
                continue
            while not self.block_manager.can_append(seq):
                victim = running.pop()  # never one before i: seq itself is still in the list
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.may_append(seq)
                seq.num_scheduled_tokens = 1
                scheduled.append(seq)
                i += 1
        self.running = deque(running)
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        assert self.role is Role.COLOCATED, "decode reserves its blocks up front; prefill never decodes"
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_scheduled_tokens = 0
        seq.is_prefilling = True  # it starts over: every token it has is prefilled again
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        self.block_manager.deallocate(seq)
