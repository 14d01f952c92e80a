"""The pools of one deployment over the replay: which workers exist, which serve, and how a pool changes size.

A pool grows by workers that serve startup_s after they are asked for (each counts toward worker-hours from the
start); it shrinks first by workers still starting (the newest first, stopped at once), then by serving ones, the
least loaded first (ties: the newest), which drain: they take no new request, finish those they hold and stop.
"""
from __future__ import annotations

import bisect

from controlplane.capacity.sizing.simulation import StageModel
from controlplane.replay.sim.model import Layout
from controlplane.replay.sim.state import Replica, ReplicaState

STREAMING_ROLES = ("decode", "colocated")  # the workers whose batches bound the gateway's admission


class Fleet:
    def __init__(self, layout: Layout, models: dict[str, StageModel], cache_blocks: int, startup_s: float) -> None:
        self.models, self.startup_s = models, startup_s
        self.cache_blocks = {role: cache_blocks if role != "decode" else 0 for role in models}
        self.pools: dict[str, list[Replica]] = {role: [] for role in layout.roles()}
        self.serving: dict[str, list[Replica]] = {role: [] for role in self.pools}
        self.changes: dict[str, tuple[list[float], list[int]]] = {role: ([], []) for role in self.pools}
        self.manual_at: dict[str, float | None] = dict.fromkeys(self.pools)
        for role, replicas in layout.roles().items():
            for _ in range(replicas):
                self._add(role, now=0.0, ready_at=0.0)
            self._record(role, 0.0)
        self._refresh()

    def _add(self, role: str, now: float, ready_at: float) -> Replica:
        replica = Replica(role, len(self.pools[role]), self.models[role], self.cache_blocks[role], now, ready_at)
        self.pools[role].append(replica)
        return replica

    def _refresh(self) -> None:
        for role, replicas in self.pools.items():
            self.serving[role] = [r for r in replicas if r.state is ReplicaState.SERVING]

    def _record(self, role: str, now: float) -> None:
        times, sizes = self.changes[role]
        times.append(now)
        sizes.append(self.size(role))

    def size(self, role: str) -> int:
        """Workers the pool is meant to have: serving and starting."""
        return sum(1 for r in self.pools[role] if r.state in (ReplicaState.SERVING, ReplicaState.STARTING))

    def ready_count(self, role: str) -> int:
        return len(self.serving[role])

    def resize(self, role: str, replicas: int, now: float) -> tuple[list[Replica], list[Replica]]:
        """(workers started, workers that now drain); those drained that hold nothing are stopped at once."""
        live = [r for r in self.pools[role] if r.state in (ReplicaState.SERVING, ReplicaState.STARTING)]
        started, drained = [], []
        for _ in range(replicas - len(live)):
            started.append(self._add(role, now, now + self.startup_s))
        excess = len(live) - replicas
        starting = [r for r in reversed(live) if r.state is ReplicaState.STARTING]
        for replica in starting[:max(0, excess)]:
            replica.state, replica.stopped_at = ReplicaState.STOPPED, now
            excess -= 1
        if excess > 0:
            serving = sorted((r for r in live if r.state is ReplicaState.SERVING),
                             key=lambda r: (r.num_outstanding, -self.pools[role].index(r)))
            for replica in serving[:excess]:
                replica.state = ReplicaState.DRAINING
                drained.append(replica)
                self.stop_if_drained(replica, now)
        self._refresh()
        self._record(role, now)
        return started, drained

    def ready(self, replica: Replica) -> bool:
        """Its start-up is over: it serves (False: it was removed meanwhile)."""
        if replica.state is not ReplicaState.STARTING:
            return False
        replica.state = ReplicaState.SERVING
        self._refresh()
        return True

    def stop_if_drained(self, replica: Replica, now: float) -> None:
        if replica.state is ReplicaState.DRAINING and not replica.num_outstanding and not replica.busy:
            replica.state, replica.stopped_at = ReplicaState.STOPPED, now

    def streaming_capacity(self, headroom: int) -> int:
        """The gateway's own admission bound: each serving streaming worker's max_num_seqs + headroom."""
        return sum(r.model.max_num_seqs + headroom for role in STREAMING_ROLES if role in self.serving
                   for r in self.serving[role])

    def sizes_at(self, times: list[float]) -> list[dict[str, int]]:
        """Role → pool size at each of `times` (the last change at or before it)."""
        out = []
        for t in times:
            sizes = {}
            for role, (change_times, change_sizes) in self.changes.items():
                i = bisect.bisect_right(change_times, t) - 1
                sizes[role] = change_sizes[max(i, 0)]
            out.append(sizes)
        return out
