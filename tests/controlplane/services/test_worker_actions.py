"""worker_restart and worker_drain record pending actions that supervision carries out."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import ActionStatus
from controlplane.services import Actor, action_succeed, worker_drain, worker_restart

pytestmark = pytest.mark.django_db


def test_a_restart_can_be_asked_again_once_the_first_finished(deployment, make_worker, operator):
    worker = make_worker(deployment, "decode")
    first = worker_restart(worker=worker, actor=operator)
    action_succeed(action_id=first.pk)
    second = worker_restart(worker=worker, actor=operator)
    assert second.pk != first.pk and second.status == ActionStatus.PENDING


def test_a_drain_blocks_a_restart_of_the_same_worker(deployment, make_worker, operator):
    worker = make_worker(deployment, "prefill")
    worker_drain(worker=worker, actor=operator)
    with pytest.raises(ControlPlaneError) as err:
        worker_restart(worker=worker, actor=operator)
    assert err.value.status == 409 and "drain in progress" in err.value.message


def test_the_same_idempotency_key_returns_the_first_restart(deployment, make_worker):
    worker = make_worker(deployment, "decode")
    first = worker_restart(worker=worker, actor=Actor.rule("worker-down"), idempotency_key="r:1")
    again = worker_restart(worker=worker, actor=Actor.rule("worker-down"), idempotency_key="r:1")
    assert again.pk == first.pk
