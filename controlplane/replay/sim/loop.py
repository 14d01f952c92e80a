"""The replay: one deployment serving a trace, event by event, faster than the clock.

1. A request arrives at the gateway: admitted, queued (admission.py) or shed.
2. Admitted, it is dispatched (routing.py) to a prefill and a decode worker (or one colocated worker), which hold
   it as outstanding; none serving, or every one full: shed.
3. Each worker steps by the engine's rules (stages.py); a prefill worker's completed prompts reach their decode
   worker kv_transfer_s later (the prefill model's), with their first token.
4. A request ends with its last token: its slot frees and the next waiting request is admitted.
5. Scaling: the schedule's changes at their times, the policy's every interval_s (fleet.py).

Deterministic: no randomness; ties between events at one instant go in the order they were scheduled, and an
event goes before an arrival at the same instant.
"""
from __future__ import annotations

import heapq
import math

from controlplane.capacity.sizing.simulation import StageModel
import controlplane.replay.sim.stages as stages
from controlplane.replay.sim.admission import GatewayQueue
from controlplane.replay.sim.fleet import Fleet
from controlplane.replay.sim.model import (Admission, Layout, Objectives, Observation, PoolObservation, Scaling,
                                           band_of, check_inputs)
from controlplane.replay.sim.prefix import affinity_key
from controlplane.replay.sim.routing import Router
from controlplane.replay.sim.state import Flight, Replica
from controlplane.replay.sim.stats import Recorder, ReplayResult, build_result, p99

STEP, HANDOFF, TIMEOUT, READY, TICK, SCHEDULE = range(6)


class Replay:
    def __init__(self, requests, *, models: dict[str, StageModel], layout: Layout, admission: Admission,
                 scaling: Scaling | None, prefix_cache_blocks: int, routing: str, warmup_s: float) -> None:
        self.colocated = layout.mode == "colocated"
        self.scaling = scaling or Scaling()
        self.fleet = Fleet(layout, models, prefix_cache_blocks, self.scaling.startup_s)
        self.router = Router(routing)
        self.gateway = GatewayQueue(admission, self._capacity_of(admission))
        self.timeout_s = admission.queue_timeout_s
        self.recorder = Recorder(self.fleet.pools, warmup_s, windowed=self.scaling.policy is not None)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        self.flights = [Flight(n, requests[i], band_of(requests[i]),
                               affinity_key(requests[i].block_hashes, requests[i].block_tokens,
                                            requests[i].prompt_tokens),
                               requests[i].arrival_s >= warmup_s) for n, i in enumerate(order)]
        self.events: list = []
        self.order = 0
        self.now = 0.0
        self.num_in_system = 0
        self.num_arrived = 0
        self.num_pending = 0  # events other than the policy's ticks
        self.transfer_s = models["prefill"].kv_transfer_s if "prefill" in models else 0.0

    def _capacity_of(self, admission: Admission):
        """The bound on running requests: the setting's, the gateway's own (with headroom), or none."""
        if admission.max_running is not None:
            return lambda: admission.max_running
        if admission.headroom is not None:
            return lambda: self.fleet.streaming_capacity(admission.headroom)
        return lambda: math.inf

    def push(self, t: float, kind: int, obj) -> None:
        self.order += 1
        self.num_pending += kind != TICK
        heapq.heappush(self.events, (t, self.order, kind, obj))

    def run(self) -> None:
        """Until every request has ended, or nothing is left that could move one (a request waiting forever for
        a pool scaled to nothing: unserved)."""
        for entry in sorted(self.scaling.schedule, key=lambda e: e[0]):
            self.push(entry[0], SCHEDULE, entry)
        if self.scaling.policy is not None:
            self.push(self.scaling.interval_s, TICK, None)
        flights, events = self.flights, self.events
        handlers = {STEP: self.step_done, HANDOFF: self.handoff, TIMEOUT: self.timeout, READY: self.ready,
                    TICK: self.tick, SCHEDULE: self.schedule}
        while True:
            i = self.num_arrived
            if events and (i == len(flights) or events[0][0] <= flights[i].arrival):
                self.now, _, kind, obj = heapq.heappop(events)
                self.num_pending -= kind != TICK
                handlers[kind](obj)
            elif i < len(flights):
                self.now = flights[i].arrival
                self.num_arrived += 1
                self.arrive(flights[i])
            else:
                break
            if self.num_arrived == len(flights) and not self.num_in_system:
                break
        for flight in flights:
            if flight.shed is None and math.isnan(flight.finished):
                flight.shed, flight.shed_at = "unserved", self.now

    # --- gateway ---
    def arrive(self, flight: Flight) -> None:
        self.num_in_system += 1
        outcome = self.gateway.offer(flight, self.now)
        if outcome == "run":
            self.dispatch(flight)
        elif outcome == "wait":
            if self.timeout_s is not None:
                self.push(self.now + self.timeout_s, TIMEOUT, flight)
        else:
            self.shed(flight, outcome)

    def pump(self) -> None:
        """Admit waiting requests while slots are free (a dispatch that fails frees its slot again)."""
        while True:
            admitted = self.gateway.take(self.now)
            if not admitted:
                return
            for flight in admitted:
                self.dispatch(flight)

    def dispatch(self, flight: Flight) -> None:
        flight.dispatched = self.now
        self.recorder.dispatched(flight)
        serving = self.fleet.serving
        if self.colocated:
            first = self.router.pick(serving["colocated"], flight.key)
            second = first
        else:
            first = self.router.pick(serving["prefill"], flight.key)
            second = self.router.pick(serving["decode"])
        if first is None or second is None:
            self.gateway.release(flight)
            empty = not all(serving.values())
            self.shed(flight, "no_ready_workers" if empty else "overloaded")
            return
        if flight.reserved() > second.model.kv_capacity_tokens:
            self.gateway.release(flight)
            self.shed(flight, "too_long")
            return
        flight.prefill_worker, flight.decode_worker = first, second
        first.num_outstanding += 1
        if second is not first:
            second.num_outstanding += 1
        first.waiting.append(flight)
        self.kick(first)

    def shed(self, flight: Flight, reason: str) -> None:
        flight.shed, flight.shed_at = reason, self.now
        self.num_in_system -= 1

    def timeout(self, flight: Flight) -> None:
        if self.gateway.expire(flight):
            self.shed(flight, "queue_timeout")

    def end(self, flight: Flight, worker: Replica) -> None:
        """Its last token is out: it leaves its worker and the gateway (the caller pumps)."""
        worker.num_outstanding -= 1
        self.fleet.stop_if_drained(worker, self.now)
        self.num_in_system -= 1
        self.recorder.finished(worker.role, flight)
        self.gateway.charge(flight, completion_tokens=flight.output)
        self.gateway.release(flight)

    # --- workers ---
    def kick(self, worker: Replica) -> None:
        if worker.busy:
            return
        if worker.role == "decode":
            seconds = stages.start_decode(worker, stages.admit(worker))
        else:
            seconds = stages.start_prefill(worker, self.colocated)
            if seconds is None and self.colocated:
                seconds = stages.start_decode(worker, 0)
        if seconds is None:
            self.fleet.stop_if_drained(worker, self.now)
            return
        worker.busy = True
        worker.busy_s += seconds
        worker.window_busy_s += seconds
        self.push(self.now + seconds, STEP, worker)

    def step_done(self, worker: Replica) -> None:
        worker.busy = False
        if worker.step_prefill is not None:
            for flight in stages.end_prefill(worker, self.colocated):
                self.first_token(worker, flight)
        else:
            for flight in stages.end_decode(worker, self.now, self.gap_of(worker.role)):
                self.end(flight, worker)
        self.pump()
        self.kick(worker)

    def gap_of(self, role: str):
        recorder, now = self.recorder, self.now
        return lambda seconds, count: recorder.gap(role, seconds, count, now)

    def first_token(self, worker: Replica, flight: Flight) -> None:
        self.gateway.charge(flight, prompt_tokens=flight.prompt)
        if not self.colocated:
            flight.first_token = self.now + self.transfer_s
            self.recorder.first_token("prefill", flight)
            worker.num_outstanding -= 1
            self.fleet.stop_if_drained(worker, self.now)
            self.push(flight.first_token, HANDOFF, flight)
            return
        flight.first_token = self.now
        self.recorder.first_token("colocated", flight)
        if flight.output == 1:
            flight.finished = self.now
            worker.kv_used -= flight.reserved()
            self.end(flight, worker)
        else:
            stages.join(worker, flight)

    def handoff(self, flight: Flight) -> None:
        worker = flight.decode_worker
        if flight.output == 1:
            flight.finished = self.now
            self.end(flight, worker)
            self.pump()
            return
        worker.waiting.append(flight)
        self.kick(worker)

    # --- scaling ---
    def resize(self, role: str, replicas: int) -> None:
        started, _ = self.fleet.resize(role, replicas, self.now)
        for worker in started:
            if worker.ready_at > self.now:
                self.push(worker.ready_at, READY, worker)
        self.pump()  # a worker serving at once (no start-up) may raise the gateway's bound

    def ready(self, worker: Replica) -> None:
        if self.fleet.ready(worker):
            self.pump()

    def schedule(self, entry) -> None:
        _, role, replicas = entry
        self.fleet.manual_at[role] = self.now
        self.resize(role, replicas)

    def tick(self, _) -> None:
        wanted = self.scaling.policy.decide(self.now, self.observe())
        for role, replicas in sorted((wanted or {}).items()):
            if role not in self.fleet.pools or replicas < 0:
                raise ValueError(f"the scaling policy asked for {replicas!r} {role!r} workers; the layout's pools: "
                                 f"{', '.join(self.fleet.pools)}")
            if replicas != self.fleet.size(role):
                self.resize(role, replicas)
        if self.num_pending or self.num_arrived < len(self.flights):
            self.push(self.now + self.scaling.interval_s, TICK, None)

    def observe(self) -> Observation:
        window, interval = self.recorder.next_window(), self.scaling.interval_s
        pools = {}
        for role, replicas in self.fleet.pools.items():
            serving = self.fleet.serving[role]
            busy = sum(r.window_busy_s for r in serving)
            for replica in replicas:
                replica.window_busy_s = 0.0
            values, counts = window.gaps[role]
            running = sum(_num_running(r) for r in serving)
            pools[role] = PoolObservation(
                replicas=self.fleet.size(role), ready=len(serving), running=running,
                waiting=sum(len(r.waiting) for r in serving) + sum(r.num_running for r in serving) - running,
                utilisation=min(1.0, busy / (interval * len(serving))) if serving else 0.0,
                ttft_p99_s=p99(window.ttfts[role]), itl_p99_s=p99(values, counts), e2e_p99_s=p99(window.e2es[role]),
                kv_usage=(sum(r.kv_used / r.model.kv_capacity_tokens for r in serving) / len(serving)
                          if serving else 0.0),
                num_served=window.num_served[role], manual_scale_at=self.fleet.manual_at[role])
        return Observation(pools=pools, queue_length=self.gateway.num_queued,
                           queue_wait_p99_s=p99(window.queue_waits))


def _num_running(worker: Replica) -> int:
    """Sequences the worker's engine runs (its requests_running gauge): the prompts of its prefill step on a prefill
    worker; the batch and the prompts whose prefill began on a colocated one; the batch on a decode one."""
    if worker.role == "prefill":
        return len(worker.step_prefill or ())
    return worker.num_running + worker.num_partial


def replay(requests, *, models: dict[str, StageModel], layout: Layout, admission: Admission,
           objectives: Objectives, scaling: Scaling | None = None, prefix_cache_blocks: int = 0,
           routing: str = "least_loaded", warmup_s: float = 0.0, bucket_s: float = 10.0) -> ReplayResult:
    """Replay `requests` (ReplayRequest, any order) through one deployment: `models` gives each role's StageModel
    ({"prefill", "decode"} or {"colocated"}), each prefill or colocated worker keeps a prefix cache of
    `prefix_cache_blocks` blocks (0: none), `routing` is "least_loaded" or "prefix". Requests arriving before
    warmup_s are served but not counted; the timeline has one entry per bucket_s. ValueError on bad inputs."""
    requests = list(requests)
    check_inputs(requests, models, layout, admission, scaling)
    if prefix_cache_blocks < 0 or not bucket_s > 0 or warmup_s < 0:
        raise ValueError("prefix_cache_blocks and warmup_s must be >= 0, bucket_s > 0")
    sim = Replay(requests, models=models, layout=layout, admission=admission, scaling=scaling,
                 prefix_cache_blocks=prefix_cache_blocks, routing=routing, warmup_s=warmup_s)
    sim.run()
    horizon = max(sim.now, sim.flights[-1].arrival if sim.flights else 0.0)
    return build_result(sim.flights, sim.recorder, sim.fleet, objectives, horizon=horizon, bucket_s=bucket_s,
                        cache_on=prefix_cache_blocks > 0)
