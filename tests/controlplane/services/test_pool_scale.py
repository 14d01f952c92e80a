"""pool_scale: the one write that operators, rules and the autoscaler share."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import Action, Pool
from controlplane.services import Actor, deployment_delete, pool_scale

pytestmark = pytest.mark.django_db


def test_it_records_who_asked_and_why(deployment):
    action = pool_scale(deployment=deployment, role="decode", replicas=4, actor=Actor.rule("p99-itl"),
                        reason="p99 ITL 0.31 s > 0.2 s for 1m")
    assert (action.actor_type, action.actor, action.user) == ("rule", "p99-itl", None)
    assert action.reason == "p99 ITL 0.31 s > 0.2 s for 1m"
    assert action.deployment_name == "demo"
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 4


def test_it_refuses_replicas_outside_min_max_without_writing(deployment):
    with pytest.raises(ControlPlaneError) as err:
        pool_scale(deployment=deployment, role="decode", replicas=9, actor=Actor.system())
    assert err.value.status == 400
    assert "between 1 and 8" in err.value.message
    assert not Action.objects.filter(kind="scale").exists()


@pytest.mark.parametrize("replicas", [True, 2.0, "2", None])
def test_it_refuses_replicas_that_are_not_an_integer(deployment, replicas):
    with pytest.raises(ControlPlaneError) as err:
        pool_scale(deployment=deployment, role="decode", replicas=replicas, actor=Actor.system())
    assert err.value.status == 400


def test_the_same_idempotency_key_returns_the_first_action(deployment):
    first = pool_scale(deployment=deployment, role="decode", replicas=2, actor=Actor.autoscaler(),
                       idempotency_key="rule:7:firing:1")
    second = pool_scale(deployment=deployment, role="decode", replicas=2, actor=Actor.autoscaler(),
                        idempotency_key="rule:7:firing:1")
    assert second.pk == first.pk
    with pytest.raises(ControlPlaneError) as err:
        pool_scale(deployment=deployment, role="decode", replicas=6, actor=Actor.autoscaler(),
                   idempotency_key="rule:7:firing:1")
    assert (err.value.status, err.value.code) == (422, "idempotency_key_reused")
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2


def test_it_refuses_a_deployment_being_deleted(deployment, admin):
    deployment_delete(deployment=deployment, actor=admin)
    with pytest.raises(ControlPlaneError) as err:
        pool_scale(deployment=deployment, role="decode", replicas=2, actor=admin)
    assert err.value.status == 409


def test_the_database_refuses_desired_outside_min_max_even_past_the_service(deployment):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        Pool.objects.filter(deployment=deployment, role="decode").update(desired_replicas=99)
