"""The autoscaler's latency targets for a deployment's pools, as capacity reads them (what one replica carries within
them: services.plans.requests_per_replica).

The autoscaling app builds on capacity (the bounds it scales within are capacity's), keeps the policies, and
provides their targets (AutoscalingConfig.ready() calls `provide`), so that capacity never imports it. Until a
provider is registered no pool has a policy, and the settings' default targets apply.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# deployment → (metric, target) of each autoscaling policy of its pools
_policy_targets: Callable[[Any], Iterable[tuple[str, float]]] = lambda deployment: ()


def provide(policy_targets: Callable[[Any], Iterable[tuple[str, float]]]) -> None:
    global _policy_targets
    _policy_targets = policy_targets


def policy_targets(deployment) -> list[tuple[str, float]]:
    return list(_policy_targets(deployment))
