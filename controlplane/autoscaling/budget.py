"""A deployment's budget of workers: its pools' desired replicas in all may not grow past `max_workers`
(DeploymentAutoscaling), in active and advisory mode alike. Each pool's own ceiling is its max_replicas, which
capacity's bounds and hpa.decide already apply (with the step cap, TANDEM_AUTOSCALE_MAX_STEP); this adds the one
limit they cannot see, the sum over pools.

1. Only growth is capped: a pool grows by at most the room left (max_workers − the deployment's desired replicas in
   all). A budget lowered below what runs shrinks nothing by itself; the autoscaler's own scale-downs still happen.
2. A pool's floor (its min_replicas, a schedule's or a predictive floor) wins over the budget, as a floor wins over
   a ceiling in capacity's bounds: an operator who asked for that capacity gets it.
3. Within one pass a scale (active) or an advice (advisory) takes its room before the next pool of the deployment is
   decided, so that the advice of two pools applied together fits as the active scales would have.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum

from controlplane.autoscaling.hpa import Decision
from controlplane.autoscaling.models import DeploymentAutoscaling
from controlplane.errors import conflict
from controlplane.models import Pool


@dataclass(slots=True)
class Budget:
    max_workers: int | None  # None: no budget
    num_workers: int  # the deployment's desired replicas in all, as the pass goes

    def room(self) -> int | None:
        return None if self.max_workers is None else max(0, self.max_workers - self.num_workers)

    def take(self, decision: Decision) -> None:
        self.num_workers += decision.desired - decision.current


def load_budgets(deployment_ids) -> dict[int, Budget]:
    """The budget of each deployment and its desired replicas now: two queries for any number of deployments."""
    ids = set(deployment_ids)
    limits = dict(DeploymentAutoscaling.objects.filter(deployment_id__in=ids, max_workers__isnull=False)
                  .values_list("deployment_id", "max_workers"))
    totals = dict(Pool.objects.filter(deployment_id__in=ids).values("deployment_id")
                  .annotate(n=Sum("desired_replicas")).values_list("deployment_id", "n"))
    return {pk: Budget(limits.get(pk), totals.get(pk) or 0) for pk in ids}


def budget_cap(decision: Decision, budget: Budget, *, floor: int) -> Decision:
    """The decision with its growth cut to the room the budget leaves (rules 1 and 2); the reason says so."""
    room = budget.room()
    if room is None or decision.desired <= decision.current:
        return decision
    desired = max(min(decision.desired, decision.current + room), min(decision.desired, floor))
    if desired == decision.desired:
        return decision
    return Decision(decision.current, desired, decision.raw,
                    f"{decision.reason}; budget {budget.max_workers} workers in all, {budget.num_workers} desired "
                    f"now → {desired}")


def budget_check(deployment, *, role: str, current: int, replicas: int, floor: int) -> None:
    """409 when scaling the deployment's `role` pool from `current` to `replicas` would pass its budget (an
    operator applying advice made before the budget was lowered, or beside another pool's applied advice); up to
    the pool's `floor` passes (rule 2)."""
    budget = load_budgets([deployment.pk])[deployment.pk]
    room = budget.room()
    if room is not None and replicas > max(current + room, floor):
        raise conflict(f"scaling {role} from {current} to {replicas} would pass the deployment's budget of "
                       f"{budget.max_workers} workers in all ({budget.num_workers} desired now, room for {room} more)",
                       max_workers=budget.max_workers, num_workers=budget.num_workers)
