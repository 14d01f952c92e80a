"""How many sequences a decode step may hold so that each stream's tokens come at the deployment's ITL objective.

A decode step feeds every running sequence one token, so its duration is what each of them waits between two tokens,
and it grows with the batch: a small fixed part (the weights read once) plus a part per sequence (its attention over
its cache, its share of the GEMMs, sampling). A worker that admits up to `max_num_seqs` whatever that costs lets a
flood of long streams make every stream's tokens, a quiet tenant's included, come at the pace of the biggest batch.

The engine records each pure decode step (no prefill tokens in it) as (sequences, seconds); `DecodeStepTimes.limit`
fits seconds = fixed + per_sequence * sequences over the recent steps (least squares) and returns the largest batch
whose fitted step stays within STEP_SHARE of the target. Where the recent steps hold one batch size only (a limit that
binds keeps the batch at it), the last fit of several sizes stands: a fit of one size takes the step as all
per-sequence (fixed = 0), which would hold a bound batch where it is, or lower, for good. Before any fit of several
sizes that pessimistic fit is all there is, and it loosens as bigger and smaller batches are seen. The limit never
falls below one sequence: a step that alone exceeds the target cannot be made faster by batching less.

The objective is a P99 of the gaps the streams see, and a gap is more than a pure decode step: a prefill between the
step's layers or beside it, the loop's delivery of the tokens. The share (STEP_SHARE) leaves room for the loop; the
prefill it does not budget for. A new request's first token costs a pass over the weights, about the step's fixed part,
and under steady arrivals that lands in more than one gap in a hundred at any batch worth running: a limit that kept a
step plus that pass within the objective held the P99 only at a batch of one or two, with every other request waiting in
the queue (tried: docs/performance.md). So the limit bounds the pace, and with it the prompt work a step takes beside
its decodes (`prefill_tokens`): a preempted stream's resume recomputes its prompt and every token it had sent, hundreds
of tokens, in chunks that made each of its steps two or three decode steps long; with a target its chunks shrink to what
the step leaves of the objective. An arrival's short prompt still runs between the layers, a pass of its own: holding it
for the next mixed step instead (tried) tripled a quiet request's median first token and still left the gaps' P99 above
the objective (docs/performance.md, 'The ITL objective'). A mixed step of a few prompt tokens runs its layers in one C
call like a decode step (decode_layers.py), so a prompt token costs no more than one more stream does, the price
`prefill_tokens` puts on it (docs/performance.md). Nor does it chase the P99 of the gaps themselves: tried, that fed on
itself (gaps above the target while sequences admitted before a lower limit still ran lowered the limit further, down to
one sequence).

Sequences already running above a limit that fell are not preempted (a recompute would cost more than the step it
saves): the scheduler admits no more until the batch is back under it. Never imports torch.
"""
from __future__ import annotations

import math
from collections import deque

# The share of the ITL objective a fitted decode step may fill.
STEP_SHARE = 0.8
# The share a step with prompt tokens beside its decodes may fill (prefill_tokens), and the fewest prompt tokens
# such a step may still take, so that a resumed or long prompt always moves.
MIXED_STEP_SHARE = 0.9
MIN_MIXED_STEP_TOKENS = 8
# Recent pure decode steps kept for the fit: a few seconds of a busy worker, so the limit follows a host whose speed
# changes (another process, a thermal limit) within that.
NUM_SAMPLES = 256
REFIT_EVERY = 16


def checked_target(itl_target_s: object) -> float | None:
    """An ITL target as the engine takes it: seconds > 0, or None (no target); ValueError otherwise."""
    if itl_target_s is None:
        return None
    if (isinstance(itl_target_s, bool) or not isinstance(itl_target_s, (int, float))
            or not math.isfinite(itl_target_s) or itl_target_s <= 0):
        raise ValueError(f"itl_target_s must be a number of seconds > 0, got {itl_target_s!r}")
    return float(itl_target_s)


class DecodeStepTimes:
    def __init__(self, num_samples: int = NUM_SAMPLES) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=num_samples)
        self._fit: tuple[float, float] | None = None
        self._spread_fit: tuple[float, float] | None = None  # the last fit over several batch sizes
        self._num_since_fit = 0

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, num_seqs: int, seconds: float) -> None:
        if num_seqs >= 1 and seconds > 0:
            self._samples.append((num_seqs, seconds))
            self._num_since_fit += 1

    @property
    def last_fit(self) -> tuple[float, float] | None:
        """The fit the limit was last computed from (None: none yet)."""
        return self._fit

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per sequence) of a decode step, or None before any step was recorded."""
        if not self._samples:
            return self._spread_fit
        n = len(self._samples)
        mean_x = sum(x for x, _ in self._samples) / n
        mean_y = sum(y for _, y in self._samples) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in self._samples)
        if var_x > 0:
            slope = sum((x - mean_x) * (y - mean_y) for x, y in self._samples) / var_x
            fixed = mean_y - slope * mean_x
            if slope > 0 and fixed >= 0:
                self._spread_fit = (fixed, slope)
                return self._spread_fit
        if self._spread_fit is not None:  # one size seen now, or a noisy fit: the last good one
            return self._spread_fit
        # One batch size ever seen, or only noisy fits (a slope or a fixed part below zero): all per sequence.
        return 0.0, mean_y / mean_x

    def limit(self, target_s: float | None, max_num_seqs: int) -> int:
        """The most sequences a decode step may hold for steps within STEP_SHARE of `target_s` (None: no target,
        max_num_seqs), at least 1 and at most max_num_seqs. The fit is redone every REFIT_EVERY steps (the
        scheduler asks every step)."""
        if target_s is None:
            return max_num_seqs
        if self._fit is None or self._num_since_fit >= REFIT_EVERY:
            self._fit, self._num_since_fit = self.fit(), 0
        fit = self._fit
        if fit is None:
            return max_num_seqs
        fixed, per_seq = fit
        budget = target_s * STEP_SHARE - fixed
        return max(1, min(max_num_seqs, int(budget / per_seq))) if budget > 0 else 1

    def prefill_tokens(self, target_s: float | None, num_decodes: int, most: int, *, own_pass: bool = False) -> int:
        """The most prompt tokens a step beside `num_decodes` running streams may take for it to stay within
        MIXED_STEP_SHARE of `target_s`: `most` without a target or a fit, never below MIN_MIXED_STEP_TOKENS (a prompt
        always moves; an arrival's short prompt still goes between the layers). `own_pass`: the prompt runs as a pass
        of its own between the step's layers (interleave.py), which reads the weights again (the fit's fixed part). A
        prompt token is priced as a decoding sequence (the fit's slope), which overprices it a little: a sequence's
        step also reads its cache."""
        if target_s is None or self._fit is None or num_decodes < 1:
            return most
        fixed, per_seq = self._fit
        room = target_s * MIXED_STEP_SHARE - fixed * (2 if own_pass else 1) - per_seq * num_decodes
        return max(MIN_MIXED_STEP_TOKENS, min(most, int(room / per_seq) if room > 0 else 0))
