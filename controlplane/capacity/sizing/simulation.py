"""A small discrete-event simulation of one layout serving a traffic profile with the fitted step times.

Why a simulation and not M/G/c: both stages batch. A prefill step's time depends on how many prompt tokens wait
(the budget fills under load), a decode step's on how many sequences run and how long their contexts are, and on a
colocated worker every prefill step stalls all running sequences. Closed forms miss all three; replaying Poisson
arrivals through the engine's own scheduling rules (the ones in inference/engine/scheduler.py) does not:

- prefill pool: one FIFO queue in front of the pool (the gateway sends to the least loaded worker); an idle
  replica takes waiting prompts in order while they fit its token budget and its max_num_seqs, and the step lasts
  prefill.step_seconds(sum of their tokens); each request's first token is out when its step ends (+ the KV push);
- decode pool: a request goes to the replica with the fewest sequences (running + waiting); a replica admits while
  it has fewer than max_num_seqs running and KV room for the request's prompt + output, then steps: every running
  sequence gets one token per step of decode.step_seconds(batch, mean context);
- colocated: the same replica does both, prefill first (new prompts join between decode steps), so a decode gap
  that spans a prefill step counts that step.

Deterministic for a given seed. Pure Python, no Django; a plan runs a few dozen of these.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve


@dataclass(frozen=True, slots=True)
class StageModel:
    """What one replica of a stage can do (from a profile)."""

    prefill: PrefillCurve
    decode: DecodeCurve
    max_num_seqs: int = 64
    max_batch_tokens: int = 2048  # prefill token budget per step
    kv_capacity_tokens: int = 1 << 30  # KV slots of one replica
    kv_transfer_s: float = 0.0  # disaggregated: the KV push after prefill, per request
    # Worker time per request outside the engine's steps (HTTP, tokenizing, receiving KV, streaming the tokens), which
    # delays the engine loop on a busy host: charged to the step a request joins on a decode or colocated replica.
    # Calibrated from a profile's saturation burst (calibrate_overhead).
    request_overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Traffic:
    requests_per_s: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    prompt_tokens_cv: float = 0.5  # coefficient of variation; 0 = every request the same length
    output_tokens_cv: float = 0.5

    def __post_init__(self) -> None:
        for name in ("requests_per_s", "prompt_tokens_mean", "output_tokens_mean"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")
        for name in ("prompt_tokens_cv", "output_tokens_cv"):
            if not 0 <= getattr(self, name) <= 4:
                raise ValueError(f"{name} must be within 0..4, not {getattr(self, name)}")

    def scaled(self, *, rate: float = 1.0, prompt: float = 1.0, output: float = 1.0) -> "Traffic":
        return Traffic(self.requests_per_s * rate, self.prompt_tokens_mean * prompt, self.output_tokens_mean * output,
                       self.prompt_tokens_cv, self.output_tokens_cv)


@dataclass(slots=True)
class Result:
    ttft_p99_s: float
    itl_p99_s: float
    ttft_p50_s: float
    itl_p50_s: float
    throughput_rps: float  # completed requests per second
    output_tokens_per_s: float
    utilisation: dict[str, float]  # stage → busy share of its replicas' time
    stable: bool  # the queues did not keep growing (everything offered got served within the run)


@dataclass(slots=True)
class _Request:
    arrival: float
    prompt: int
    output: int
    first_token: float = math.nan
    last_token: float = math.nan
    finished: float = math.nan
    remaining: int = 0
    index: int = 0


def _lengths(rng: random.Random, mean: float, cv: float, n: int) -> list[int]:
    """Gamma-distributed lengths with the given mean and coefficient of variation (≥ 1 token)."""
    if cv == 0:
        return [max(1, round(mean))] * n
    shape = 1.0 / (cv * cv)
    return [max(1, round(rng.gammavariate(shape, mean / shape))) for _ in range(n)]


def _requests(traffic: Traffic, num_requests: int, seed: int, max_context: int) -> list[_Request]:
    rng = random.Random(seed)
    prompts = _lengths(rng, traffic.prompt_tokens_mean, traffic.prompt_tokens_cv, num_requests)
    outputs = _lengths(rng, traffic.output_tokens_mean, traffic.output_tokens_cv, num_requests)
    t, requests = 0.0, []
    for prompt, output in zip(prompts, outputs):
        t += rng.expovariate(traffic.requests_per_s)
        prompt = min(prompt, max_context - 1)
        requests.append(_Request(arrival=t, prompt=prompt, output=max(1, min(output, max_context - prompt))))
    return requests


def _quantile(weighted: list[tuple[float, int]], q: float) -> float:
    """The q-quantile of values given with counts [(value, count)]."""
    if not weighted:
        return math.nan
    weighted = sorted(weighted)
    total = sum(n for _, n in weighted)
    rank, seen = q * total, 0
    for value, n in weighted:
        seen += n
        if seen >= rank:
            return value
    return weighted[-1][0]


@dataclass(slots=True)
class _Replica:
    """One worker: its queue of requests waiting to prefill (colocated) or to be admitted (decode), its running
    batch and, while stepping, what the step does."""

    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy_until: float = 0.0
    busy_s: float = 0.0
    step: tuple | None = None  # ("prefill", [requests]) | ("decode", None)
    last_decode_end: float = math.nan
    kv_used: int = 0
    context_sum: int = 0


class _Sim:
    def __init__(self, model: StageModel, requests: list[_Request], *, layout: str, prefill_replicas: int,
                 decode_replicas: int):
        self.model, self.requests, self.layout = model, requests, layout
        self.events: list[tuple[float, int, str, int]] = []  # (time, order, kind, index)
        self.order = 0
        self.gaps: list[tuple[float, int]] = []
        self.prefill_queue: deque = deque()
        self.prefill = [_Replica() for _ in range(prefill_replicas)] if layout == "disaggregated" else []
        self.decode = [_Replica() for _ in range(decode_replicas)]
        self.now = 0.0

    def push(self, t: float, kind: str, index: int) -> None:
        self.order += 1
        heapq.heappush(self.events, (t, self.order, kind, index))

    def run(self) -> None:
        for i, request in enumerate(self.requests):
            self.push(request.arrival, "arrival", i)
        while self.events:
            self.now, _, kind, index = heapq.heappop(self.events)
            if kind == "arrival":
                self.arrive(self.requests[index])
            elif kind == "prefill_done":
                self.prefill_done(self.prefill[index])
            elif kind == "handoff":
                self.to_decode(self.requests[index])
            else:
                self.decode_step_done(self.decode[index], index)

    # --- prefill pool (disaggregated) ---
    def arrive(self, request: _Request) -> None:
        if self.layout == "disaggregated":
            self.prefill_queue.append(request)
            for i, replica in enumerate(self.prefill):
                if replica.step is None:
                    self.start_prefill_step(replica, i)
        else:
            self.to_decode(request)

    def take_prompts(self, queue: deque, limit: int) -> list[_Request]:
        batch, tokens = [], 0
        while queue and len(batch) < limit and (not batch or tokens + queue[0].prompt <= self.model.max_batch_tokens):
            request = queue.popleft()
            batch.append(request)
            tokens += request.prompt
        return batch

    def start_prefill_step(self, replica: _Replica, i: int) -> None:
        batch = self.take_prompts(self.prefill_queue, self.model.max_num_seqs)
        if not batch:
            return
        seconds = self.model.prefill.step_seconds(sum(r.prompt for r in batch), sum(r.prompt ** 2 for r in batch))
        replica.step, replica.busy_until = ("prefill", batch), self.now + seconds
        replica.busy_s += seconds
        self.push(replica.busy_until, "prefill_done", i)

    def prefill_done(self, replica: _Replica) -> None:
        _, batch = replica.step
        replica.step = None
        for request in batch:
            request.first_token = request.last_token = self.now + self.model.kv_transfer_s
            request.remaining = request.output - 1
            if request.remaining <= 0:
                request.finished = request.first_token
            else:
                self.push(request.first_token, "handoff", request.index)
        self.start_prefill_step(replica, self.prefill.index(replica))

    # --- decode pool, or colocated replicas ---
    def to_decode(self, request: _Request) -> None:
        i = min(range(len(self.decode)), key=lambda k: len(self.decode[k].running) + len(self.decode[k].waiting))
        replica = self.decode[i]
        replica.waiting.append(request)
        if replica.step is None:
            self.start_decode_step(replica, i)

    def start_decode_step(self, replica: _Replica, i: int) -> None:
        model = self.model
        if self.layout == "colocated":
            room = model.max_num_seqs - len(replica.running)
            fits = deque()
            while replica.waiting and len(fits) < room and \
                    replica.kv_used + replica.waiting[0].prompt + replica.waiting[0].output <= model.kv_capacity_tokens:
                fits.append(replica.waiting.popleft())
            batch = self.take_prompts(fits, room)
            replica.waiting.extendleft(reversed(fits))  # what did not fit this step's budget waits, in order
            if batch:
                for request in batch:
                    replica.kv_used += request.prompt + request.output
                seconds = model.prefill.step_seconds(sum(r.prompt for r in batch),
                                                     sum(r.prompt ** 2 for r in batch)) \
                    + len(batch) * model.request_overhead_s
                replica.step, replica.busy_until = ("prefill", batch), self.now + seconds
                replica.busy_s += seconds
                self.push(replica.busy_until, "decode", i)
                return
        admitted = 0
        if self.layout != "colocated":
            while replica.waiting and len(replica.running) < model.max_num_seqs and \
                    replica.kv_used + replica.waiting[0].prompt + replica.waiting[0].output <= model.kv_capacity_tokens:
                request = replica.waiting.popleft()
                replica.kv_used += request.prompt + request.output
                replica.running.append(request)
                replica.context_sum += request.prompt + 1
                admitted += 1
        if not replica.running:
            replica.step = None
            return
        batch = len(replica.running)
        seconds = model.decode.step_seconds(batch, replica.context_sum / batch) + admitted * model.request_overhead_s
        replica.step, replica.busy_until = ("decode", None), self.now + seconds
        replica.busy_s += seconds
        self.push(replica.busy_until, "decode", i)

    def decode_step_done(self, replica: _Replica, i: int) -> None:
        kind, batch = replica.step
        if kind == "prefill":  # colocated: the prompts' first tokens are out; they join the running batch
            for request in batch:
                request.first_token = request.last_token = self.now
                request.remaining = request.output - 1
                if request.remaining <= 0:
                    request.finished = self.now
                    replica.kv_used -= request.prompt + request.output
                else:
                    replica.running.append(request)
                    replica.context_sum += request.prompt + 1
        else:
            still = []
            for request in replica.running:
                self.gaps.append((self.now - request.last_token, 1))
                request.last_token = self.now
                request.remaining -= 1
                if request.remaining <= 0:
                    request.finished = self.now
                    replica.kv_used -= request.prompt + request.output
                    replica.context_sum -= request.prompt + request.output
                else:
                    still.append(request)
            replica.context_sum += len(still)
            replica.running = still
        replica.step = None
        self.start_decode_step(replica, i)


def simulate(model: StageModel, traffic: Traffic, *, layout: str, prefill_replicas: int = 0,
             decode_replicas: int = 1, num_requests: int = 600, seed: int = 1,
             max_context: int = 1 << 20) -> Result:
    """Serve `num_requests` Poisson arrivals of `traffic` with `layout` ("disaggregated": prefill_replicas +
    decode_replicas; "colocated": decode_replicas colocated workers). The first 10% of requests warm the queues up
    and are not counted."""
    if layout not in ("disaggregated", "colocated"):
        raise ValueError(f"layout must be disaggregated or colocated, not {layout!r}")
    if decode_replicas < 1 or (layout == "disaggregated" and prefill_replicas < 1):
        raise ValueError("every pool needs at least one replica to simulate")
    requests = _requests(traffic, num_requests, seed, max_context)
    for index, request in enumerate(requests):
        request.index = index
    sim = _Sim(model, requests, layout=layout, prefill_replicas=prefill_replicas, decode_replicas=decode_replicas)
    sim.run()
    counted = requests[len(requests) // 10:]
    start = counted[0].arrival
    done = [r for r in counted if not math.isnan(r.finished)]
    horizon = max(r.finished for r in done) if done else start  # nothing finished: no throughput
    served_duration = max(horizon - start, 1e-9)
    ttfts = [(r.first_token - r.arrival, 1) for r in counted]
    gaps = sim.gaps
    busy = {"decode" if layout == "disaggregated" else "colocated":
            sum(r.busy_s for r in sim.decode) / (len(sim.decode) * max(horizon, 1e-9))}
    if layout == "disaggregated":
        busy["prefill"] = sum(r.busy_s for r in sim.prefill) / (len(sim.prefill) * max(horizon, 1e-9))
    output_tokens = sum(r.output for r in done)
    return Result(
        ttft_p99_s=_quantile(ttfts, 0.99), itl_p99_s=_quantile(gaps, 0.99) if gaps else 0.0,
        ttft_p50_s=_quantile(ttfts, 0.5), itl_p50_s=_quantile(gaps, 0.5) if gaps else 0.0,
        throughput_rps=len(done) / served_duration, output_tokens_per_s=output_tokens / served_duration,
        utilisation=busy, stable=_stable(counted))


def _stable(counted: list[_Request]) -> bool:
    """A queue that keeps growing makes the last requests of the run wait far longer than the first ones."""
    fifth = max(1, len(counted) // 5)
    def mean_e2e(part):
        return sum(r.finished - r.arrival for r in part) / len(part)
    if any(math.isnan(r.finished) for r in counted):
        return False
    return mean_e2e(counted[-fifth:]) <= 2.0 * mean_e2e(counted[:fifth]) + 1e-3


def makespan(model: StageModel, *, layout: str, num_requests: int, prompt_tokens: int, output_tokens: int) -> float:
    """Seconds until the last of `num_requests` identical requests sent at once has finished (one replica per
    pool): the shape of a profile's saturation burst."""
    requests = [_Request(arrival=0.0, prompt=prompt_tokens, output=output_tokens, index=i) for i in range(num_requests)]
    _Sim(model, requests, layout=layout, prefill_replicas=1, decode_replicas=1).run()
    return max(r.finished for r in requests)


def calibrate_overhead(model: StageModel, *, layout: str, num_requests: int, prompt_tokens: int, output_tokens: int,
                       wall_s: float, steps: int = 30) -> float:
    """The per-request overhead that makes the simulated burst last as long as the measured one (bisection; 0 when
    the fitted step times alone already account for it)."""
    from dataclasses import replace

    def span(overhead: float) -> float:
        return makespan(replace(model, request_overhead_s=overhead), layout=layout, num_requests=num_requests,
                        prompt_tokens=prompt_tokens, output_tokens=output_tokens)

    if span(0.0) >= wall_s:
        return 0.0
    low, high = 0.0, wall_s / max(1, num_requests)
    while span(high) < wall_s:
        high *= 2
    for _ in range(steps):
        middle = (low + high) / 2
        if span(middle) < wall_s:
            low = middle
        else:
            high = middle
    return (low + high) / 2
