"""One worker's steps, by the engine's rules (inference/engine/scheduler.py) with the profile's step times.

Prefill (a prefill worker's steps, and a colocated worker's prefill steps): waiting prompts in arrival order fill
the step's token budget (max_batch_tokens) and, on a prefill worker, its max_num_seqs; a prompt longer than what is
left of the budget gets a chunk of it and the rest in the next steps (chunked prefill), but a partial chunk never
follows a prompt that completes in the same step (it would only make that step, and so that prompt's first token,
later). A prompt's prefill begins with a look-up of its blocks in the worker's cache: it computes only what is not
cached (at least one token). A chunk of c tokens after p already in the KV cache costs c·(2p + c) of the curve's
quadratic term, so a prompt's chunks cost what the whole prompt costs in one step.

Colocated: a prompt begins its prefill only while the worker holds fewer than max_num_seqs sequences and has KV
room for the prompt and its whole output (reserved up front); a step is a prefill step whenever a prompt can take
the budget, else a decode step of the running batch, so a prefill step stalls every running stream (its gap spans
it). The engine's mixed steps (decode tokens beside a prefill chunk in one forward) are not modelled.

Decode: a prefilled request joins the batch between steps while the worker runs fewer than max_num_seqs and has KV
room for its prompt and whole output (reserved, as the decode role does, so it is never preempted); in arrival
order, so the head blocks those behind it. A step of B sequences of mean context L lasts decode.step_seconds(B, L),
plus request_overhead_s for each request that joined it.
"""
from __future__ import annotations

import heapq

from controlplane.replay.sim.state import Flight, Replica


def _begin(replica: Replica, flight: Flight, colocated: bool) -> None:
    """A prompt's prefill begins: what its cache holds, and on colocated its KV reservation."""
    flight.started = True
    matched = replica.cache.match(flight.hashes) if replica.cache.num_blocks else 0
    flight.num_cached = min(matched * flight.block_tokens, flight.prompt - 1)
    flight.num_uncached = flight.prompt - flight.num_cached
    if colocated:
        replica.num_partial += 1
        replica.kv_used += flight.reserved()


def start_prefill(replica: Replica, colocated: bool) -> float | None:
    """Choose the step's chunks (replica.step_prefill) and answer its seconds; None when no prompt can run."""
    model = replica.model
    budget = model.max_batch_tokens
    batch, tokens, sum_sq, num_new, completes = [], 0, 0, 0, False
    for flight in replica.waiting:
        if not flight.started:
            if colocated:
                if replica.num_running + replica.num_partial >= model.max_num_seqs or \
                        replica.kv_used + flight.reserved() > model.kv_capacity_tokens:
                    break
            elif len(batch) >= model.max_num_seqs:
                break
            _begin(replica, flight, colocated)
            num_new += 1
        left = flight.num_uncached - flight.num_prefilled
        take = min(left, budget)
        if take < left and completes:
            break
        done_before = flight.num_cached + flight.num_prefilled
        batch.append((flight, take))
        tokens += take
        sum_sq += take * (2 * done_before + take)
        budget -= take
        completes = completes or take == left
        if not budget:
            break
    if not batch:
        return None
    replica.step_prefill = batch
    seconds = model.prefill.step_seconds(tokens, sum_sq)
    if colocated:
        seconds += num_new * model.request_overhead_s
    return seconds


def end_prefill(replica: Replica, colocated: bool) -> list[Flight]:
    """The step's chunks are computed: the prompts it completed, taken off the queue, their blocks cached."""
    done = []
    for flight, tokens in replica.step_prefill:
        flight.num_prefilled += tokens
        if flight.num_prefilled == flight.num_uncached:
            done.append(flight)
    replica.step_prefill = None
    for flight in done:
        assert replica.waiting[0] is flight, "a prompt completed its prefill ahead of one before it"
        replica.waiting.popleft()
        replica.cache.insert(flight.hashes)
    if colocated:
        replica.num_partial -= len(done)
    return done


def join(replica: Replica, flight: Flight) -> None:
    """A prefilled request (its first token out) joins the decode batch."""
    replica.num_running += 1
    replica.context_sum += flight.prompt + 1
    flight.finish_step = replica.num_steps + flight.output - 1
    heapq.heappush(replica.finishing, (flight.finish_step, flight.index, flight))
    replica.joined.append(flight)


def admit(replica: Replica) -> int:
    """Decode role: prefilled requests join the batch while it has room; how many joined."""
    model, waiting, num = replica.model, replica.waiting, 0
    while waiting and replica.num_running < model.max_num_seqs and \
            replica.kv_used + waiting[0].reserved() <= model.kv_capacity_tokens:
        flight = waiting.popleft()
        replica.kv_used += flight.reserved()
        join(replica, flight)
        num += 1
    return num


def start_decode(replica: Replica, num_joined: int) -> float | None:
    """A step of the whole batch; None when it is empty."""
    batch = replica.num_running
    if not batch:
        return None
    replica.step_batch = batch
    model = replica.model
    return model.decode.step_seconds(batch, replica.context_sum / batch) + num_joined * model.request_overhead_s


def end_decode(replica: Replica, now: float, gap) -> list[Flight]:
    """Every sequence of the step has one more token: its gaps go to `gap(seconds, count)`; answers those that
    produced their last token, taken out of the batch."""
    batch, joined = replica.step_batch, replica.joined
    continuing = batch - len(joined)
    if continuing:
        gap(now - replica.last_decode_end, continuing)
    for flight in joined:
        gap(now - flight.first_token, 1)
    joined.clear()
    replica.num_steps += 1
    replica.context_sum += batch
    replica.last_decode_end = now
    done, finishing = [], replica.finishing
    while finishing and finishing[0][0] <= replica.num_steps:
        flight = heapq.heappop(finishing)[2]
        flight.finished = now
        replica.num_running -= 1
        replica.context_sum -= flight.prompt + flight.output
        replica.kv_used -= flight.reserved()
        done.append(flight)
    return done
