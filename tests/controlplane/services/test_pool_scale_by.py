"""pool_scale_by: the one scale-by-a-step, clamped to min..max, that alert rules, Alertmanager and the dashboard's
+1/−1 buttons share."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import Action, Pool
from controlplane.services import Actor, PoolAtBound, pool_scale, pool_scale_by

pytestmark = pytest.mark.django_db


def _desired(deployment, role="decode") -> int:
    return Pool.objects.get(deployment=deployment, role=role).desired_replicas


def test_it_scales_by_the_step_and_says_from_and_to_in_the_reason(deployment):
    action = pool_scale_by(deployment=deployment, role="decode", step=2, actor=Actor.rule("kv-high"),
                           reason="kv usage 0.95")
    assert _desired(deployment) == 3
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert action.reason == "kv usage 0.95; 1 → 3 replicas"


def test_a_step_past_max_is_clamped_to_max(deployment):
    pool_scale(deployment=deployment, role="decode", replicas=7, actor=Actor.system())
    action = pool_scale_by(deployment=deployment, role="decode", step=5, actor=Actor.system())
    assert _desired(deployment) == 8 and action.params["to"] == 8


def test_at_its_bound_it_raises_pool_at_bound_and_writes_nothing(deployment):
    with pytest.raises(PoolAtBound) as err:
        pool_scale_by(deployment=deployment, role="decode", step=-1, actor=Actor.system())
    assert err.value.status == 400 and err.value.code == "at_bound"
    assert err.value.message == "decode pool already at its min (1 replicas)"
    assert not Action.objects.filter(kind="scale").exists()


@pytest.mark.parametrize("step", [0, True, 1.5, "1", None])
def test_a_step_that_is_not_a_non_zero_integer_is_a_400(deployment, step):
    with pytest.raises(ControlPlaneError) as err:
        pool_scale_by(deployment=deployment, role="decode", step=step, actor=Actor.system())
    assert err.value.extra["field"] == "step"


def test_the_same_idempotency_key_scales_once(deployment):
    first = pool_scale_by(deployment=deployment, role="decode", step=1, actor=Actor.system(), idempotency_key="k")
    again = pool_scale_by(deployment=deployment, role="decode", step=1, actor=Actor.system(), idempotency_key="k")
    assert first.pk == again.pk and _desired(deployment) == 2
