"""The engine's side of a step that pauses between its layers for a prefill (interleave.py has the mechanism and why):
which requests the step under way holds, those of them aborted meanwhile, and the prefill that runs while it is paused.

A step's sequences are in flight while it runs: an abort of one is taken when the step ends (its K/V slots are being
written), and its place in the batch goes to the arrivals at once. The prefill between layers (`prefill_between`)
runs within what the step's earlier pauses left of its budget, and pauses in turn: an arrival that outranks it is
prefilled at its next layer, its sequences in flight like the step's. In chunked mode the same prefill runs at a
step's start (`prefill_first`) where requests already wait beside running streams.
"""
from __future__ import annotations

from collections.abc import Callable

from inference.engine.interleave import Arrivals, Pause
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence


class StepPause:
    def __init__(self, arrivals: Arrivals, scheduler: Scheduler, run: Callable, outputs: Callable):
        # run: the runner's step (ModelRunner.run); outputs: the engine's postprocess of a step's tokens into its
        # StepOutputs (LLMEngine._outputs)
        self.arrivals, self.scheduler, self._run, self._outputs = arrivals, scheduler, run, outputs
        self.in_flight: frozenset[str] | None = None  # the paused step's request ids while it runs
        self.pause: Pause | None = None  # the paused step's, which its prefills between layers pause on too
        self.leaving: list[str] = []  # in flight and aborted: freed when the step ends
        self.prefilling: Sequence | None = None  # the first of the prefill between layers that runs now
        self.num_between_tokens = 0  # prefilled between the paused step's layers so far: its budget is for all
        self.num_tokens = 0  # the last prefill between layers' tokens (what the engine reports as its step's)

    def holds(self, request_id: str) -> bool:
        """Whether `request_id` is in flight (then its abort waits for the step's end: it is noted as leaving)."""
        if self.in_flight is None or request_id not in self.in_flight:
            return False
        if request_id not in self.leaving:
            self.leaving.append(request_id)
        return True

    def take_leaving(self) -> list[str]:
        """The requests aborted while the step ran, now free to leave."""
        leaving, self.leaving = self.leaving, []
        return leaving

    def run_step(self, seqs: list[Sequence], is_prefill: bool, between: Callable[[], None]) -> tuple[list, bool]:
        """The step's forward, paused between layers where the flag is raised: (its token ids, whether anything was
        prefilled between its layers)."""
        self.in_flight = frozenset(seq.request_id for seq in seqs)
        self.num_between_tokens = 0
        self.pause = Pause(self.arrivals, lambda: self._between(between))
        try:
            token_ids = self._run(seqs, is_prefill, self.pause)
        finally:
            self.in_flight = self.pause = None
        return token_ids, bool(self.num_between_tokens)

    def prefill_first(self, between: Callable[[], None]) -> list | None:
        """At a step's start, beside running streams: the waiting requests that a pause would prefill (their whole
        prompt within the chunk beside decodes), prefilled alone as a step of their own, as if they had come while
        the step before ran; None when there are none (the step schedules as usual). Without this a request that
        came in the step's tail (past its last look at the flag: sampling, delivery) rode the next mixed step,
        whose first token costs every running stream's decode too: it came out later than a prefill between layers
        (docs/performance.md, "A quiet request's path, traced")."""
        scheduler = self.scheduler
        if not scheduler.waiting or not any(not seq.is_prefilling for seq in scheduler.running):
            return None
        self.in_flight, self.num_between_tokens = frozenset(), 0
        self.pause = Pause(self.arrivals, lambda: self._between(between))
        try:
            outputs = self.prefill_between()
        finally:
            self.in_flight = self.pause = None
        return outputs if self.num_tokens else None

    def _between(self, between: Callable[[], None]) -> None:
        self.arrivals.lower()  # before the commands are taken: one queued after this raises it again
        between()

    def prefill_between(self) -> list:
        """While a step is paused: prefill the waiting requests that can start now (Scheduler.schedule_between,
        within what the step's earlier pauses left of its budget) and return their StepOutputs; `num_tokens` is this
        prefill's until the paused step ends.

        This prefill pauses between its layers too: a request arriving during it that outranks it (a better band, or
        a tenant holding fewer sequences) is prefilled at its next layer (a nested call, within what is left of the
        same budget), so that it does not wait for a prefill that came just before it; one that does not waits for
        it (a flood's request prefilled inside a quiet one's would delay the quiet one's first token)."""
        if self.in_flight is None:
            raise RuntimeError("prefill_between runs only while a step is paused")
        outer = self.prefilling
        seqs = self.scheduler.schedule_between(len(self.leaving), self.num_between_tokens, outranking=outer)
        num_tokens = self.num_tokens = self.scheduler.num_batched_tokens
        self.num_between_tokens += num_tokens
        if not seqs:
            return []
        in_flight = self.in_flight
        self.in_flight, self.prefilling = in_flight | {seq.request_id for seq in seqs}, seqs[0]
        try:
            token_ids = self._run(seqs, True, self.pause)
        finally:
            self.in_flight, self.prefilling = in_flight, outer
        self.num_tokens = num_tokens  # a nested prefill set its own
        return self._outputs(seqs, token_ids, True)
