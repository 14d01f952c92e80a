"""The order a scheduler admits its waiting sequences in, and whether one may join the running batch now.

Priority bands: each sequence has its request's band (interactive, standard, batch: the gateway's class for its
tenant; sequence.PRIORITY_BANDS), and every admission order of the scheduler (scheduler.py) is taken band first: the FIFO head of the
non-chunked prefill and of the decode role's admission is the oldest sequence of the best band waiting (of the tenant
holding fewest, below), and the chunked candidates are ordered by band (and tenant), then by their aged remaining
prefill. So a quiet tenant's interactive request does not queue behind the resumed and re-dispatched streams of a
noisy batch one. A preempted sequence goes back to the front of its band. Within a band, a request of the tenant
holding the fewest running sequences here goes first (its `cache_salt`, which the gateway sets to its tenant; requests
without one all tie, and keep the order above): a quiet tenant's request that the gateway preempted a flood's stream
for does not take the place behind the flood's requests already waiting here (measured with bench/gateway/tenants.py's
isolation scenario: docs/performance.md). No band starves: a waiting sequence moves
up one band per `priority_aging_s` seconds since it was first queued, so a batch request competes as interactive (and
then, within the band, by its age) after two such spans at most; up to the best band among those waiting beside it,
never past it, so aging lifts a request past other classes' requests and never past those of its own class, where the
tenant rule orders (a flood's request that had waited over the span went ahead of a quiet tenant's fresh one of the
same class). Seconds, not steps: a step lasts a millisecond on a
small model on a CPU and tens on a large one, and what the bound protects is a client's wait.

ITL objective (batch_limit.py): a sequence may carry its deployment's ITL objective; admission (every path of the
scheduler) then stops at `seq_limit`, the largest batch whose decode step the recent steps' fit keeps within it,
instead of `max_num_seqs`, except for a sequence whose tenant holds less than its fair share of that limit
(_has_room). What waits beyond it waits in the order above.
"""
from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from inference.engine.sequence import Sequence

# Seconds a waiting sequence needs to move up one band: a batch request overtaken without end still competes as
# interactive after 4 s (the gateway's own queue holds an interactive request for 10 s at most).
PRIORITY_AGING_S = 2.0


class AdmissionOrder:
    """The part of the Scheduler (scheduler.py) that orders and bounds admission; it sets these attributes."""

    waiting: deque[Sequence]
    running: deque[Sequence]
    clock: Callable[[], float]
    priority_aging_s: float
    max_num_seqs: int
    seq_limit: int  # what admission lets run now: max_num_seqs, or fewer under an ITL objective (batch_limit.py)
    _room: tuple[int, Counter[bytes], int] | None  # _has_room's counts, for this many running

    def itl_target_s(self) -> float | None:
        """The tightest ITL objective among the sequences here (one deployment's: they all carry the same)."""
        return min((seq.itl_target_s for queue in (self.running, self.waiting) for seq in queue
                    if seq.itl_target_s is not None), default=None)

    def band(self, seq: Sequence, now: float, floor: int = 0) -> int:
        """`seq`'s priority band at `now`: its request's, less one per `priority_aging_s` since it was queued, but not
        past `floor`, the best request band among those it competes with (_floor): aging lifts a request up to other
        classes' requests, never past those of its own class, whose order is the tenant rule's."""
        return max(floor, seq.priority - int((now - seq.queued_at) / self.priority_aging_s))

    @staticmethod
    def _floor(seqs) -> int:
        return min((seq.priority for seq in seqs), default=0)

    def _holding(self) -> Counter[bytes]:
        """Running sequences per tenant (cache_salt)."""
        return Counter(seq.cache_salt for seq in self.running)

    def _by_priority(self) -> list[Sequence]:
        """The waiting queue, best band first, then the tenant holding fewest sequences; FIFO within those (a stable
        sort of the queue's order)."""
        now, holding, floor = self.clock(), self._holding(), self._floor(self.waiting)
        return sorted(self.waiting, key=lambda seq: (self.band(seq, now, floor), holding[seq.cache_salt]))

    def _has_room(self, seq: Sequence, num_leaving: int = 0) -> bool:
        """Whether `seq` may join the running batch now: below `seq_limit`; or above it, below max_num_seqs, where its
        tenant holds fewer running sequences than its fair share of seq_limit (split evenly over the tenants with
        sequences here). So a tenant's request is not held behind another tenant's sequences admitted before the
        limit fell, and a flood holding more than its share gets no more while others wait."""
        num_running = len(self.running) - num_leaving
        if num_running < self.seq_limit:
            return True
        if num_running >= self.max_num_seqs:
            return False
        # Counted once per admission, not per waiting sequence asked (admitting one changes len(self.running)).
        if self._room is None or self._room[0] != len(self.running):
            tenants = {s.cache_salt for s in self.running} | {s.cache_salt for s in self.waiting}
            self._room = (len(self.running), self._holding(), len(tenants))
        _, holding, num_tenants = self._room
        return holding[seq.cache_salt] < max(1, self.seq_limit // num_tenants)
