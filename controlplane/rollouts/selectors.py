"""Reads of rollouts shared by reconcile, the endpoints answer, services, the API and the pages."""
from __future__ import annotations

import math

from django.db.models import Max

from controlplane.errors import not_found
from controlplane.rollouts.models import ACTIVE_STATUSES, Rollout, RolloutStatus, Strategy

MAX_ID = 2**63 - 1
LATEST = object()  # traffic_weights and variant_names read the latest rollout themselves


def rollout_active(deployment) -> Rollout | None:
    """The running or paused rollout of a deployment (at most one: a partial unique constraint)."""
    return (Rollout.objects.filter(deployment=deployment, status__in=ACTIVE_STATUSES)
            .select_related("revision", "stable_revision").first())


def rollout_latest(deployment) -> Rollout | None:
    return Rollout.objects.filter(deployment=deployment).select_related("revision", "stable_revision").first()


def rollouts_latest(deployment_ids: list[int]) -> dict[int, Rollout]:
    """rollout_latest of each deployment that has had one, by deployment id, in one query (a shared gateway's poll)."""
    newest = (Rollout.objects.filter(deployment_id__in=deployment_ids).order_by().values("deployment_id")
              .annotate(newest=Max("id")).values("newest"))
    return {rollout.deployment_id: rollout
            for rollout in Rollout.objects.filter(pk__in=newest).select_related("revision", "stable_revision")}


def rollout_list(deployment):
    return Rollout.objects.filter(deployment=deployment).select_related("revision", "stable_revision", "created_by")


def rollout_get(deployment, rollout_id: int) -> Rollout:
    if not isinstance(rollout_id, int) or not 0 < rollout_id <= MAX_ID:
        raise not_found(f"rollout {rollout_id!r} does not exist")
    rollout = rollout_list(deployment).filter(pk=rollout_id).first()
    if rollout is None:
        raise not_found(f"deployment {deployment.name!r} has no rollout {rollout_id}")
    return rollout


def tried_replicas(pool, rollout: Rollout) -> int:
    """How many workers of the tried revision a pool runs beside its stable workers: its share of the pool's
    desired replicas at the step's weight, rounded up, at least 1 (a role without a worker cannot serve a request
    inside the revision). Stable keeps its full size until promotion, so an abort never leaves it short."""
    return max(1, math.ceil(pool.desired_replicas * rollout.weight / 100))


def traffic_weights(deployment, revisions: set[int], rollout=LATEST) -> dict[int, int] | None:
    """Each ready revision group's traffic weight for the gateway (docs/contracts.md), or None: no rollout
    concerns these groups, and the gateway keeps serving the newest complete group.

    1. An active rollout: the tried revision gets the step's weight, stable the rest.
    2. A rollout that ended (aborted, completed, promoted) while its other revision still has ready workers
       (they drain over the next reconcile passes): the current revision gets everything, so traffic leaves them at
       the next membership poll instead of when they are gone.

    `rollout`: the deployment's latest rollout (or None) where the caller read it already (rollouts_latest).
    """
    rollout = rollout_latest(deployment) if rollout is LATEST else rollout
    if rollout is None:
        return None
    tried, stable = rollout.revision.number, rollout.stable_revision.number
    if rollout.is_active:
        weight = rollout.weight
        return {tried: weight, stable: 100 - weight}
    current = deployment.current_revision.number if deployment.current_revision_id else None
    # Only while the revision the rollout left current is still current (a later new revision or rollback is an
    # ordinary rolling replacement again, whose groups need no weights).
    left_current = tried if rollout.status == RolloutStatus.PROMOTED else stable
    if current == left_current and (revisions - {current}) & {tried, stable}:
        return {current: 100}
    return None


def variant_names(deployment, rollout=LATEST) -> dict[int, str]:
    """revision number → variant ("stable"/"canary", "a"/"b") of the latest rollout, for display and headers
    (`rollout`: as traffic_weights takes it)."""
    rollout = rollout_latest(deployment) if rollout is LATEST else rollout
    if rollout is None or rollout.strategy not in (Strategy.CANARY, Strategy.AB):
        return {}
    stable_name, tried_name = rollout.variants
    return {rollout.stable_revision.number: stable_name, rollout.revision.number: tried_name}
