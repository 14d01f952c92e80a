"""A deployment's budget of workers in all (max_workers) caps the autoscaler's growth in active and advisory mode
alike, after the step cap and the pool's bounds; a floor wins over it, and applying advice past it is a 409."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool, autoscale_pools
from controlplane.autoscaling.budget import Budget, budget_cap
from controlplane.autoscaling.hpa import Decision
from controlplane.autoscaling.models import ScaleAdvice
from controlplane.autoscaling.services import autoscaling_update
from controlplane.models import Pool
from tests.controlplane.autoscaling.support import advisory, observe, pool_of


@pytest.mark.parametrize("mode", ["active", "advisory"])
def test_the_budget_caps_a_scale_up_in_either_mode(scaled, operator, mode):
    autoscaling_update(deployment=scaled, actor=operator, mode=mode, max_workers=3)  # 1 prefill + 1 decode now
    observe(scaled, "itl_p99_seconds", 0.3)
    decision = autoscale_pool(pool_of(scaled), now=time.time())
    assert decision.desired == 2 and "budget 3 workers in all, 2 desired now → 2" in decision.reason
    if mode == "active":
        assert pool_of(scaled).desired_replicas == 2
    else:
        assert pool_of(scaled).desired_replicas == 1
        assert ScaleAdvice.objects.get().to_replicas == 2


@pytest.mark.parametrize("mode", ["active", "advisory"])
def test_two_pools_growing_in_one_pass_share_the_room(scaled, operator, make_worker, mode):
    make_worker(scaled, "prefill")
    autoscaling_update(deployment=scaled, actor=operator, mode=mode, max_workers=4)
    observe(scaled, "itl_p99_seconds", 0.3)
    observe(scaled, "ttft_p99_seconds", 3.0, role="prefill")  # default prefill target: 1 s
    pools = Pool.objects.filter(deployment=scaled).select_related("deployment").order_by("role")
    decisions = [d for _, d in autoscale_pools(pools, now=time.time())]
    assert sum(d.desired - d.current for d in decisions) == 2  # the room of 4 − 2, taken by the first pool
    if mode == "advisory":
        assert sum(a.to_replicas - a.from_replicas for a in ScaleAdvice.objects.all()) == 2


def test_a_pools_floor_wins_over_the_budget_and_shrinking_is_never_capped():
    assert budget_cap(Decision(1, 4, 4, "r"), Budget(3, 3), floor=2).desired == 2
    assert budget_cap(Decision(3, 1, 1, "r"), Budget(2, 5), floor=1).desired == 1
    assert budget_cap(Decision(1, 4, 4, "r"), Budget(None, 50), floor=1).desired == 4


def test_applying_advice_past_a_budget_lowered_since_is_a_409(scaled, operator, operator_api):
    advisory(scaled, operator)
    observe(scaled, "itl_p99_seconds", 0.3)
    autoscale_pool(pool_of(scaled), now=time.time())
    advice = ScaleAdvice.objects.get()
    assert advice.to_replicas == 3
    autoscaling_update(deployment=scaled, actor=operator, max_workers=3)
    response = operator_api.post(f"/api/v1/deployments/demo/autoscaling/advice/{advice.pk}/apply", {},
                                 format="json")
    assert response.status_code == 409
    assert ("scaling decode from 1 to 3 would pass the deployment's budget of 3 workers in all"
            in response.json()["error"]["message"])
    assert pool_of(scaled).desired_replicas == 1
