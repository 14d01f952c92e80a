"""The rollout a deployment runs beside its current revision (a canary or an A/B experiment), as the core reads it.

Reconcile keeps the tried revision's workers, the revision services refuse a new revision while a rollout runs, and
the endpoints answer gives each revision group its traffic weight. The rollouts app knows all four answers and
provides them (RolloutsConfig.ready() calls `provide`), so that the core depends on this seam and never imports a
feature app. Until a provider is registered no deployment has a rollout: no tried workers, no weights.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RolloutProvider:
    # deployment → its running or paused rollout (`pk`, `strategy`, `status`, `revision`, `revision_id`), or None
    rollout_active: Callable[[Any], Any]
    # (pool, active rollout) → how many workers of the tried revision the pool runs beside its current ones
    tried_replicas: Callable[[Any, Any], int]
    # (deployment, ready revision numbers[, its latest rollout]) → revision number → traffic weight (0-100), or
    # None: no split
    traffic_weights: Callable[..., dict[int, int] | None]
    # (deployment[, its latest rollout]) → revision number → variant name ("stable"/"canary", "a"/"b")
    variant_names: Callable[..., dict[int, str]]
    # deployment ids → the latest rollout of each that has had one (what the two above take, read at once for the
    # deployments of a shared gateway's poll)
    rollouts_latest: Callable[[list[int]], dict[int, Any]] = lambda deployment_ids: {}


NO_ROLLOUTS = RolloutProvider(rollout_active=lambda deployment: None, tried_replicas=lambda pool, rollout: 0,
                              traffic_weights=lambda deployment, revisions, *rollout: None,
                              variant_names=lambda deployment, *rollout: {})

_provider = NO_ROLLOUTS


def provide(provider: RolloutProvider) -> None:
    global _provider
    _provider = provider


def rollout_active(deployment):
    return _provider.rollout_active(deployment)


def tried_replicas(pool, rollout) -> int:
    return _provider.tried_replicas(pool, rollout)


def traffic_weights(deployment, revisions: set[int], *rollout) -> dict[int, int] | None:
    return _provider.traffic_weights(deployment, revisions, *rollout)


def variant_names(deployment, *rollout) -> dict[int, str]:
    return _provider.variant_names(deployment, *rollout)


def rollouts_latest(deployment_ids: list[int]) -> dict[int, Any]:
    return _provider.rollouts_latest(deployment_ids)
