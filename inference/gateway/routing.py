"""Which worker serves a request: groups by revision, health probing, weighted least-outstanding selection.

A request is served inside one group (one revision), because a prefill and a decode worker of different revisions
may not share a KV layout or a tokenizer. Among the ready workers of a role, the one with the least
(outstanding + 1) / weight wins, as nginx's least_conn with `weight=`; ties go to the one picked longest ago, so that
an idle fleet still spreads load. The + 1 counts the request being placed: with nothing outstanding anywhere a bare
outstanding / weight ties at 0 for every worker and the heavier one would not be preferred; with it, while requests
pile up a weight-3 worker takes three for each one a weight-1 worker takes, and under steady load each holds
outstanding requests in proportion to its weight.

Prefix affinity (prefix_affinity.py): a request with an affinity key, on a stage whose ready workers all report
prefix caching in /health, goes to the worker a consistent hash with bounded loads names, so that requests that
begin alike find their prefix cached; `--no-prefix-affinity` turns it off. Decode workers compute no prompt: they
are always picked by load.

Which group serves a request is the newest complete one, unless the membership splits traffic between groups
(`traffic_weight`, a canary or A/B rollout): then traffic_split.py chooses.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
from dataclasses import dataclass, field
from enum import Enum

from inference.engines import TANDEM
from inference.gateway import traffic_split
from inference.gateway.config import Config, Mode
from inference.gateway.prefix_affinity import HashRing, affinity_key, bounded_pick
from inference.gateway.openai_protocol import ApiError
from inference.roles import Role
from inference.weights import DEFAULT_WEIGHT

# A request that finds no ready group while a just-listed worker awaits its first probe waits this long for it.
FIRST_PROBE_WAIT_S = 2.0

log = logging.getLogger("tandem.gateway.routing")


class WorkerState(Enum):
    UNKNOWN = "unknown"  # listed, not probed yet: not in rotation
    READY = "ready"
    DOWN = "down"        # failed a probe or a connection: out of rotation until a probe says it is healthy again


@dataclass(slots=True, eq=False)
class Worker:
    url: str
    role: Role
    state: WorkerState = WorkerState.UNKNOWN
    reason: str = "not probed yet"
    num_outstanding: int = 0
    last_picked: int = 0
    dtype: str | None = None  # what the worker's /health says it runs; None until a probe answers ok
    kv_cache_dtype: str | None = None  # its KV cache's (the model's, or narrower), as /health says; None: dtype's
    max_model_len: int | None = None  # the context its /health says it serves (its KV pool may hold less than the model)
    weight: float = DEFAULT_WEIGHT  # relative share of its role's traffic (membership, --worker-weight)
    kv_url: str | None = None  # a decode worker's: where prefill pushes its KV when not to `url` (membership kv_urls)
    max_prompt_chars: int | None = None  # what its /health says no fitting prompt exceeds (None: not said)
    prefix_caching: bool = False  # what its /health says: it keeps prompt prefixes cached (prefix affinity pays)
    max_num_seqs: int | None = None  # what its /health says it runs at once (None: not said)
    # What its /health says it admits now: fewer than max_num_seqs where the ITL objective bounds its decode batch.
    batch_limit: int | None = None
    probe_timeouts: int = 0  # health probes in a row that got no answer in time (health_probe.py)
    engine: str = TANDEM  # what it runs (inference.engines): how it is probed and spoken to
    # Set when the worker is taken out of rotation: the streams it holds move on at once (TokenStream) instead of
    # waiting on a hung worker. A fresh one once it is ready again.
    ejected: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def is_ready(self) -> bool:
        return self.state is WorkerState.READY

    @property
    def load(self) -> float:
        """What pick minimises: outstanding requests, the one being placed included, per unit of weight."""
        return (self.num_outstanding + 1) / self.weight


@dataclass(slots=True)
class Group:
    revision: int | None
    mode: Mode
    prefill: list[Worker] = field(default_factory=list)
    decode: list[Worker] = field(default_factory=list)
    colocated: list[Worker] = field(default_factory=list)
    traffic_weight: int | None = None  # its share of traffic under a split; None: the membership gives none
    variant: str | None = None         # what a rollout calls it ("stable", "canary", "a", "b"), for the response
    engine: str = TANDEM               # the engine its workers run (inference.engines): one per revision

    def workers(self, role: Role) -> list[Worker]:
        return {Role.PREFILL: self.prefill, Role.DECODE: self.decode, Role.COLOCATED: self.colocated}[role]

    @property
    def roles(self) -> tuple[Role, ...]:
        return (Role.PREFILL, Role.DECODE) if self.mode is Mode.DISAGGREGATED else (Role.COLOCATED,)

    def missing(self) -> list[str]:
        """Why this group cannot serve, one line per missing stage; empty when complete."""
        reasons = []
        for role in self.roles:
            workers = self.workers(role)
            if any(w.is_ready for w in workers):
                continue
            if not workers:
                reasons.append(f"no {role.value} worker listed")
            else:
                detail = "; ".join(f"{w.url}: {w.reason}" for w in workers)
                reasons.append(f"no ready {role.value} worker ({detail})")
        return reasons

    @property
    def is_complete(self) -> bool:
        return not self.missing()

    def max_prompt_chars(self) -> int | None:
        """The most characters a prompt may have to fit every ready worker of the first stage (None: none says)."""
        first = Role.PREFILL if self.mode is Mode.DISAGGREGATED else Role.COLOCATED
        limits = [w.max_prompt_chars for w in self.workers(first) if w.is_ready and w.max_prompt_chars]
        return min(limits) if limits else None

    def describe(self) -> dict:
        return {"revision": self.revision, "mode": self.mode.value, "traffic_weight": self.traffic_weight,
                "variant": self.variant, **{
            role.value: [{"url": w.url, "state": w.state.value, "reason": w.reason if not w.is_ready else None,
                          "outstanding": w.num_outstanding, "weight": w.weight, "dtype": w.dtype,
                          **({"kv_url": w.kv_url} if w.kv_url else {})}
                         for w in self.workers(role)]
            for role in self.roles}}


@dataclass(frozen=True, slots=True)
class Plan:
    """Where one attempt of a request goes inside its group: the colocated worker, or (disaggregated) the prefill
    worker that computes the prompt and the decode worker it hands the KV to."""
    first: Worker
    decode: Worker | None = None


def _revision_key(group: Group) -> tuple[bool, int]:
    return (group.revision is not None, group.revision or 0)


class Router:
    def __init__(self, config: Config, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()  # draws the group of an unsticky request under a traffic split
        self.groups: list[Group] = []          # newest revision first
        self.membership_error: str | None = "no membership yet"
        self._workers: dict[tuple[Role, str], Worker] = {}
        self._pick_counter = itertools.count(1)
        self._rings: dict[tuple, HashRing] = {}  # by the (url, weight) of a stage's listed workers
        # Prefix-affinity decisions by (stage, "affinity" | "spilled"): taken the key's home worker, or a later one
        # on its ring because the home was loaded above the bound.
        self.affinity_decisions: dict[tuple[str, str], int] = {}
        # Set when the membership lists a worker not seen before: health_probe.py probes it at once.
        self.probe_wakeup = asyncio.Event()

    # -- membership ---------------------------------------------------------------------------------------------------

    def set_groups(self, mode: Mode, groups: list[dict]) -> None:
        """Replace the membership. Workers already known keep their state and outstanding count and take the weight
        the new membership gives (`weights`: URL → weight, default 1); new ones wait for their first probe, which is
        started right away. A decode worker's `kv_url` is what the membership's `kv_urls` says now (None: its URL)."""
        new_groups: list[Group] = []
        known: dict[tuple[Role, str], Worker] = {}
        for spec in groups:
            group = Group(revision=spec.get("revision"), mode=mode, traffic_weight=spec.get("traffic_weight"),
                          variant=spec.get("variant"), engine=spec.get("engine") or TANDEM)
            weights = {url.rstrip("/"): weight for url, weight in (spec.get("weights") or {}).items()}
            kv_urls = {url.rstrip("/"): kv_url.rstrip("/") for url, kv_url in (spec.get("kv_urls") or {}).items()}
            for role in group.roles:
                for url in spec.get(role.value) or []:
                    key = (role, url.rstrip("/"))
                    worker = known.get(key) or self._workers.get(key) or Worker(url=key[1], role=role)
                    worker.weight = weights.get(key[1], DEFAULT_WEIGHT)
                    worker.kv_url = kv_urls.get(key[1])
                    worker.engine = group.engine
                    if group.engine != TANDEM:
                        # Its /health says nothing but "up": what it serves is the revision's, as the membership says.
                        worker.max_num_seqs = spec.get("max_num_seqs")
                        worker.prefix_caching = spec.get("prefix_caching") is True
                    known[key] = worker
                    group.workers(role).append(worker)
            new_groups.append(group)
        new_groups.sort(key=_revision_key, reverse=True)
        if set(known) - set(self._workers):
            self.probe_wakeup.set()
        self._workers = known
        self.groups = new_groups
        self.membership_error = None

    @property
    def workers(self) -> list[Worker]:
        return list(self._workers.values())

    # -- selection ----------------------------------------------------------------------------------------------------

    def serving_group(self) -> Group:
        """The newest group with every stage ready; 503 naming what is missing otherwise."""
        for group in self.groups:
            if group.is_complete:
                return group
        raise self._no_group()

    def pick_group(self, variant_key: str | None = None) -> Group:
        """The group that serves a new request: under a traffic split the one traffic_split.choose picks (sticky to
        `variant_key` when given), else the newest complete one; 503 naming what is missing when none is complete."""
        if not traffic_split.is_split(self.groups):
            return self.serving_group()
        group = traffic_split.choose(self.groups, variant_key, self.rng)
        if group is None:
            raise self._no_group()
        return group

    async def pick_group_probed(self, variant_key: str | None = None, wait_s: float = FIRST_PROBE_WAIT_S) -> Group:
        """pick_group; but while a listed worker has not been probed yet (the membership just named it, and its first
        probe was started then), wait up to `wait_s` for that probe before answering 503: a replacement listed in the
        same poll that took out the worker it replaces would otherwise fail the requests of that moment."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                return self.pick_group(variant_key)
            except ApiError:
                unprobed = any(w.state is WorkerState.UNKNOWN for w in self._workers.values())
                if not unprobed or asyncio.get_running_loop().time() >= deadline:
                    raise
            await asyncio.sleep(0.05)

    def _no_group(self) -> ApiError:
        return ApiError(503, f"no ready worker group: {self.unavailable_reason()}", type="service_unavailable",
                       code="no_ready_workers", headers={"Retry-After": "1"})

    def fallback_group(self, group: Group) -> Group | None:
        """Where a request that failed before its first token on a canary gets one more try: the complete group a
        rollout calls "stable". None for any other group (an A/B variant is a choice, not a trial)."""
        if group.variant != "canary":
            return None
        return next((g for g in self.groups if g is not group and g.variant == "stable" and g.is_complete), None)

    def complete_group(self, revision: int | None) -> Group | None:
        """The group of `revision` while it has every stage ready (a request that moves stays in its revision)."""
        for group in self.groups:
            if group.revision == revision and group.is_complete:
                return group
        return None

    def unavailable_reason(self) -> str:
        if not self.groups:
            return self.membership_error or "no workers configured"
        parts = []
        for group in self.groups:
            label = "static group" if group.revision is None else f"revision {group.revision}"
            parts.append(f"{label}: " + ", ".join(group.missing()))
        return "; ".join(parts)

    def worker_capacity(self, worker: Worker) -> int:
        """Requests one worker that holds streams may run at once: the max_num_seqs its /health reports (or its
        batch_limit, where the ITL objective holds its decode batch below that: the backlog then waits here, in the
        fair queue, not in the worker's own) plus --worker-capacity-headroom, at most --max-outstanding-per-worker
        (which alone counts where it reports none)."""
        limit = self.config.max_outstanding_per_worker
        if worker.max_num_seqs is None:
            return limit
        num_seqs = min(worker.max_num_seqs, worker.batch_limit or worker.max_num_seqs)
        return min(limit, num_seqs + self.config.worker_capacity_headroom)

    def capacity(self) -> int:
        """Requests that may run at once (admission.py): `worker_capacity` summed over each ready worker that holds
        streams (decode, or colocated) of every complete group, so that requests wait in the gateway's fair queue
        rather than in the workers' own FIFO queues. A prefill worker holds a request only until its first token, so
        it bounds nothing here (a full one still answers 429 through `pick`)."""
        total = 0
        for group in self.groups:
            if group.is_complete:
                role = Role.DECODE if group.mode is Mode.DISAGGREGATED else Role.COLOCATED
                total += sum(self.worker_capacity(w) for w in group.workers(role) if w.is_ready)
        return total

    def plan(self, group: Group, body: dict, exclude: set[str] = frozenset()) -> Plan:
        """The workers one attempt of `body` uses in `group`, by its mode, skipping `exclude`: the first stage by
        prefix affinity where it applies (a key taken from the prompt), else by load; decode always by load."""
        key = affinity_key(body, self.config.prefix_affinity_chars) if self.config.prefix_affinity else None
        if group.mode is Mode.DISAGGREGATED:
            return Plan(self.pick(group, Role.PREFILL, exclude, key), self.pick(group, Role.DECODE, exclude))
        return Plan(self.pick(group, Role.COLOCATED, exclude, key))

    def pick(self, group: Group, role: Role, exclude: set[str] = frozenset(), key: str | None = None) -> Worker:
        """The ready worker of `role` in `group` with the least (outstanding + 1) / weight, ties to the one picked
        longest ago, skipping `exclude` (workers this request already failed on); with an affinity `key`, where
        prefix affinity applies (module docstring), the one its bounded-load ring walk names. 429 when every
        candidate is at --max-outstanding-per-worker (a cap on each worker, whatever its weight); 503 when none is
        ready."""
        candidates = [w for w in group.workers(role) if w.is_ready and w.url not in exclude]
        if not candidates:
            raise ApiError(503, f"no ready {role.value} worker left to try", type="service_unavailable",
                           code="no_ready_workers", headers={"Retry-After": "1"})
        limit = self.config.max_outstanding_per_worker
        if (key is not None and self.config.prefix_affinity and role is not Role.DECODE
                and all(w.prefix_caching for w in candidates)):
            members = group.workers(role)
            worker, is_home = bounded_pick(self._ring(members), members, key, candidates, limit)
            if worker is not None:
                decision = (role.value, "affinity" if is_home else "spilled")
                self.affinity_decisions[decision] = self.affinity_decisions.get(decision, 0) + 1
                worker.last_picked = next(self._pick_counter)
                return worker
        best = None
        for worker in candidates:
            if worker.num_outstanding >= limit:
                continue
            if best is None or (worker.load, worker.last_picked) < (best.load, best.last_picked):
                best = worker
        if best is None:
            raise overloaded(f"every {role.value} worker has {limit} outstanding requests")
        best.last_picked = next(self._pick_counter)
        return best

    def _ring(self, workers: list[Worker]) -> HashRing:
        members = tuple((w.url, w.weight) for w in workers)
        ring = self._rings.get(members)
        if ring is None:
            if len(self._rings) > 64:  # memberships come and go: keep only recent rings
                self._rings.clear()
            ring = self._rings[members] = HashRing(members)
        return ring

    def mark_down(self, worker: Worker, reason: str) -> None:
        """Out of rotation until a probe finds it healthy: for a connection that failed, never for one request's
        error answer (which would let any client that can make a worker fail lock everyone out of it)."""
        if worker.state is not WorkerState.DOWN:
            log.warning("%s %s out of rotation: %s", worker.role.value, worker.url, reason)
        worker.state = WorkerState.DOWN
        worker.reason = reason
        worker.ejected.set()


def overloaded(message: str, retry_after: str = "1") -> ApiError:
    return ApiError(429, f"the gateway is at capacity: {message}; retry later", type="rate_limit_error",
                    code="overloaded", headers={"Retry-After": retry_after})
