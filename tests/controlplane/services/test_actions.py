"""Action rows: actors, idempotency, and the conditional transitions supervision makes."""
from __future__ import annotations

import pytest

from controlplane.models import ActionStatus
from controlplane.services import (Actor, DuplicateAction, action_create, action_fail, action_start,
                                   action_succeed, as_actor)

pytestmark = pytest.mark.django_db


def test_a_user_is_turned_into_a_user_actor(operator):
    actor = as_actor(operator)
    assert (actor.type, actor.name, actor.user) == ("user", "otto-operator", operator)


def test_an_anonymous_user_is_not_an_actor():
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(TypeError):
        as_actor(AnonymousUser())


def test_an_actor_type_must_be_known():
    with pytest.raises(ValueError):
        Actor("martian", "x")


def test_start_then_succeed_happen_once(deployment):
    action = action_create(kind="scale", actor=Actor.system(), deployment=deployment)
    assert action_start(action_id=action.pk) is True
    assert action_start(action_id=action.pk) is False  # another process got there first
    assert action_succeed(action_id=action.pk, result={"num_ready": 2}) is True
    assert action_fail(action_id=action.pk, error="late") is False  # finished actions stay finished
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED
    assert action.result == {"num_ready": 2}
    assert action.started_at <= action.finished_at


def test_fail_keeps_the_error_and_sets_both_timestamps(deployment):
    action = action_create(kind="restart", actor=Actor.system(), deployment=deployment)
    assert action_fail(action_id=action.pk, error="exit code 1: CUDA out of memory") is True
    action.refresh_from_db()
    assert action.status == ActionStatus.FAILED
    assert action.error == "exit code 1: CUDA out of memory"
    assert action.started_at is not None and action.finished_at is not None


def test_a_taken_idempotency_key_raises_duplicate_with_the_first_action(deployment):
    first = action_create(kind="notify", actor=Actor.webhook("alertmanager"), deployment=deployment,
                          idempotency_key="am:abc:firing")
    with pytest.raises(DuplicateAction) as dup:
        action_create(kind="notify", actor=Actor.webhook("alertmanager"), deployment=deployment,
                      idempotency_key="am:abc:firing")
    assert dup.value.action.pk == first.pk


def test_a_key_first_used_for_another_kind_of_action_is_a_409(deployment, make_worker, operator):
    from controlplane.errors import ControlPlaneError
    from controlplane.services import pool_scale, worker_restart

    pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator, idempotency_key="same")
    with pytest.raises(ControlPlaneError) as err:
        worker_restart(worker=make_worker(deployment, "decode"), actor=operator, idempotency_key="same")
    assert err.value.status == 409 and "already used for a scale action" in err.value.message


def test_the_reconcile_is_sent_with_the_deployment_id_only_after_commit(deployment, operator, monkeypatch,
                                                                       django_capture_on_commit_callbacks):
    from controlplane.services import pool_scale
    from controlplane.supervision import tasks

    sent = []
    # The edge: the broker. What crosses it is the task and its argument, an id.
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async",
                        lambda args=(), **options: sent.append(*args))
    with django_capture_on_commit_callbacks(execute=True):
        pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator)
        assert sent == []
    assert sent == [deployment.pk]


def test_a_broker_that_is_down_does_not_undo_or_fail_the_committed_change(deployment, operator, monkeypatch,
                                                                         django_capture_on_commit_callbacks):
    from controlplane.models import Pool
    from controlplane.services import pool_scale
    from controlplane.supervision import tasks

    def refuse(args=(), **options):
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        action = pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator)
    assert action.pk is not None
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2
