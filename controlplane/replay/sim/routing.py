"""Which worker the gateway sends a request to (inference/gateway/routing.py's rules).

By load: the serving worker with the least (outstanding + 1) / weight, ties to the one picked longest ago. By prefix
(routing="prefix", on the stage that computes prompts: prefill, or colocated): the gateway's own consistent hash
with bounded loads (prefix_affinity.bounded_pick) over the serving workers, keyed by the request's leading blocks;
a request without block hashes, or one the ring finds no worker for, goes by load. Decode workers compute no
prompt: always by load. A worker already holding MAX_OUTSTANDING requests takes none (the gateway's 429).
"""
from __future__ import annotations

from inference.gateway.prefix_affinity import HashRing, bounded_pick

from controlplane.replay.sim.state import Replica

ROUTINGS = ("least_loaded", "prefix")
MAX_OUTSTANDING = 256  # the gateway's default --max-outstanding-per-worker


class Router:
    def __init__(self, routing: str) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
        self.by_prefix = routing == "prefix"
        self.num_picks = 0
        self._rings: dict[tuple, HashRing] = {}

    def pick(self, workers: list[Replica], key: str | None = None) -> Replica | None:
        """The worker for a request among the pool's serving `workers` (None: none can take it)."""
        if not workers:
            return None
        self.num_picks += 1
        if key is not None and self.by_prefix:
            worker, _ = bounded_pick(self._ring(workers), workers, key, workers, MAX_OUTSTANDING)
            if worker is not None:
                worker.last_picked = self.num_picks
                return worker
        best, best_key = None, None
        for worker in workers:
            if worker.num_outstanding >= MAX_OUTSTANDING:
                continue
            key = ((worker.num_outstanding + 1) / worker.weight, worker.last_picked)
            if best is None or key < best_key:
                best, best_key = worker, key
        if best is not None:
            best.last_picked = self.num_picks
        return best

    def _ring(self, workers: list[Replica]) -> HashRing:
        members = tuple((w.url, w.weight) for w in workers)
        ring = self._rings.get(members)
        if ring is None:
            ring = self._rings[members] = HashRing(members)
        return ring
