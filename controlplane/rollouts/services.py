"""Write services of rollouts: start, promote, abort, pause, resume, and the driver's step moves. Each changes the
rows in one transaction with the deployment and rollout rows locked, records one Action, and enqueues a reconcile.

How a rollout moves workers and traffic: the tried revision's workers run beside stable's (reconcile keeps
`tried_replicas` per pool); the endpoints answer gives each group its traffic weight; promotion makes the tried
revision current, after which the ordinary rolling replacement fills its pools and drains stable's; an abort or the
end of an A/B experiment leaves stable current, and reconcile drains the tried revision's workers.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from controlplane.errors import conflict, invalid
from controlplane.models import ActionKind, ActionStatus, Deployment
from controlplane.rollouts.models import ACTIVE_STATUSES, Rollout, RolloutStatus, Strategy
from controlplane.rollouts.notify import rollout_abort_notify
from controlplane.rollouts.validation import validate_ab, validate_conditions, validate_steps, validate_strategy
from controlplane.services.actions import (action_create, action_once, as_actor, enqueue_reconcile,
                                          shown_idempotency_key)
from controlplane.services.deployments import deployment_revision_set
from controlplane.services.revisions import lock_for_rollout, revision_add, revision_fields_validate

_REVISION_FIELDS = ("model_path", "dtype", "engine_settings", "comment")


def _revision_spec(deployment: Deployment, revision):
    """`revision` is an existing revision number, or an object of fields for a new revision (copied from the
    current one where left out). Returns (number or None, checked fields or None)."""
    if isinstance(revision, dict):
        unknown = sorted(set(revision) - set(_REVISION_FIELDS))
        if unknown:
            raise invalid(f"revision.{unknown[0]} is not a revision field; a new revision has "
                          f"{', '.join(_REVISION_FIELDS)}", field=f"revision.{unknown[0]}")
        model_path, dtype, engine_settings = revision_fields_validate(
            deployment, model_path=revision.get("model_path"), dtype=revision.get("dtype"),
            engine_settings=revision.get("engine_settings"))
        comment = revision.get("comment") or ""
        if not isinstance(comment, str):
            raise invalid("revision.comment must be a string", field="revision.comment")
        return None, {"model_path": model_path, "dtype": dtype, "engine_settings": engine_settings,
                      "comment": comment}
    if isinstance(revision, bool) or not isinstance(revision, int):
        raise invalid(f"revision must be a revision number or an object of new revision fields, not {revision!r}",
                      field="revision")
    return revision, None


def rollout_start(*, deployment: Deployment, actor, revision, strategy: str = Strategy.CANARY, steps=None,
                  analysis=None, split=None, duration_s=None, reason: str = "",
                  idempotency_key: str | None = None) -> Rollout:
    """Start a canary or A/B rollout of `revision` beside the current (stable) one.

    400 naming the field for a bad request (an unknown revision, the current one, bad steps or conditions); 409
    while another rollout (or a rolling replacement) of the deployment runs, or while it is being deleted. The same
    idempotency key returns the same rollout.
    """
    actor = as_actor(actor)
    strategy = validate_strategy(strategy)
    if strategy == Strategy.ROLLING:
        raise invalid("strategy rolling replaces both pools at once: create a revision (POST .../revisions/) or "
                      "roll back (POST .../rollback); rollouts are canary or ab", field="strategy")
    if strategy == Strategy.CANARY:
        if split is not None or duration_s is not None:
            field = "split" if split is not None else "duration_s"
            raise invalid(f"{field} is for A/B experiments; a canary has steps", field=field)
        steps = validate_steps(steps)
    else:
        if steps is not None:
            raise invalid("steps are for canaries; an A/B experiment has a split and a duration_s", field="steps")
        steps = validate_ab(split, duration_s)
    conditions = validate_conditions(analysis)
    number, new_fields = _revision_spec(deployment, revision)

    def write():
        locked = lock_for_rollout(deployment)
        stable = locked.current_revision
        if stable is None:
            raise conflict(f"deployment {locked.name!r} has no current revision to compare with")
        if new_fields is not None:
            tried = revision_add(deployment=locked, actor=actor, **new_fields)
        else:
            tried = locked.revisions.filter(number=number).first()
            if tried is None:
                numbers = list(locked.revisions.order_by("number").values_list("number", flat=True))
                raise invalid(f"deployment {locked.name!r} has no revision {number} (it has {numbers})",
                              field="revision")
            if tried.pk == stable.pk:
                raise invalid(f"revision {number} is the current revision: a rollout tries another one",
                              field="revision")
        rollout = Rollout.objects.create(deployment=locked, strategy=strategy, revision=tried,
                                         stable_revision=stable, steps=steps, analysis=conditions,
                                         created_by=actor.user)
        action = action_create(
            kind=ActionKind.ROLLOUT, actor=actor, deployment=locked, reason=reason, status=ActionStatus.SUCCEEDED,
            idempotency_key=idempotency_key,
            params={"rollout": rollout.pk, "event": "started", "strategy": strategy, "revision": tried.number,
                    "stable_revision": stable.number, "steps": steps, "analysis": conditions})
        enqueue_reconcile(locked.pk)
        return action

    action = action_once(kind=ActionKind.ROLLOUT, idempotency_key=idempotency_key, write=write, request={
        "deployment": deployment.pk, "op": "start", "revision": revision, "strategy": strategy, "steps": steps,
        "analysis": conditions})
    rollout_id = (action.params or {}).get("rollout")
    if action.params.get("event") != "started" or rollout_id is None:
        raise conflict(f"idempotency key {shown_idempotency_key(idempotency_key)!r} was used for another rollout "
                       f"request (action "
                       f"{action.pk})", action_id=action.pk)
    return Rollout.objects.select_related("revision", "stable_revision").get(pk=rollout_id)


def _lock(rollout: Rollout, *, allowed=ACTIVE_STATUSES, verb: str) -> Rollout:
    """Lock the deployment row (every writer of desired state locks it first) and then the rollout; 409 unless
    the rollout is in one of `allowed`."""
    Deployment.objects.select_for_update(of=("self",)).filter(pk=rollout.deployment_id).first()
    locked = (Rollout.objects.select_for_update(of=("self",))
              .select_related("deployment", "revision", "stable_revision").get(pk=rollout.pk))
    if locked.status not in allowed:
        raise conflict(f"rollout {locked.pk} is {locked.status}: it cannot be {verb}", rollout_id=locked.pk)
    return locked


def _event(rollout: Rollout, *, kind: str, actor, event: str, reason: str, idempotency_key: str | None,
           status: str = ActionStatus.SUCCEEDED, result: dict | None = None, **params):
    """The Action of a rollout's event: every row names the rollout, its strategy, the revision tried and stable's,
    so that the audit log reads without the rollout at hand. A `step` is 1-based, as the pages and the API count
    steps."""
    return action_create(kind=kind, actor=actor, deployment=rollout.deployment, reason=reason, status=status,
                         idempotency_key=idempotency_key, result=result,
                         params={"rollout": rollout.pk, "event": event, "strategy": rollout.strategy,
                                 "revision": rollout.revision.number,
                                 "stable_revision": rollout.stable_revision.number, "num_steps": len(rollout.steps),
                                 **params})


def rollout_promote(*, rollout: Rollout, actor, reason: str = "", idempotency_key: str | None = None):
    """Make the tried revision current. The `promote` action runs until the rolling replacement has drained every
    stable worker (reconcile finishes it like a revision's rollout). Returns the Action."""
    actor = as_actor(actor)

    def write():
        locked = _lock(rollout, verb="promoted")
        now = timezone.now()
        Rollout.objects.filter(pk=locked.pk).update(status=RolloutStatus.PROMOTED, finished_at=now,
                                                    reason=reason or "promoted")
        deployment = locked.deployment
        deployment_revision_set(deployment=deployment, revision=locked.revision)
        action = _event(locked, kind=ActionKind.PROMOTE, actor=actor, event="promoted", reason=reason,
                        idempotency_key=idempotency_key, status=ActionStatus.RUNNING,
                        from_revision=locked.stable_revision.number, to_revision=locked.revision.number)
        enqueue_reconcile(deployment.pk)
        return action

    return action_once(kind=ActionKind.PROMOTE, idempotency_key=idempotency_key, write=write,
                       request={"rollout": rollout.pk})


def rollout_abort(*, rollout: Rollout, actor, reason: str = "", failures: list[dict] | None = None,
                  idempotency_key: str | None = None):
    """Send all traffic back to stable (the tried group's weight is 0 from the next membership poll), let
    reconcile drain and stop the tried revision's workers, record the failing numbers, notify the channels."""
    actor = as_actor(actor)
    failures = list(failures or [])

    def write():
        locked = _lock(rollout, verb="aborted")
        Rollout.objects.filter(pk=locked.pk).update(status=RolloutStatus.ABORTED, finished_at=timezone.now(),
                                                    reason=reason or "aborted")
        # The deliveries first, so that the action is recorded whole with them (both in this transaction: an abort
        # that rolls back queues nothing).
        deliveries = rollout_abort_notify(rollout=locked, reason=reason or "aborted", failures=failures,
                                          idempotency_key=f"rollout-{locked.pk}-aborted")
        action = _event(locked, kind=ActionKind.ABORT, actor=actor, event="aborted", reason=reason,
                        idempotency_key=idempotency_key, result={"deliveries": deliveries}, failures=failures,
                        step=locked.step_index + 1)
        enqueue_reconcile(locked.deployment_id)
        return action

    return action_once(kind=ActionKind.ABORT, idempotency_key=idempotency_key, write=write,
                       request={"rollout": rollout.pk})


def rollout_pause(*, rollout: Rollout, actor, reason: str = "", idempotency_key: str | None = None):
    """Stop the step's timer (and its analysis' verdict) where it is; traffic keeps its split."""
    actor = as_actor(actor)

    def write():
        locked = _lock(rollout, allowed=(RolloutStatus.RUNNING,), verb="paused")
        Rollout.objects.filter(pk=locked.pk).update(status=RolloutStatus.PAUSED,
                                                    step_elapsed_s=locked.step_elapsed(), step_started_at=None)
        return _event(locked, kind=ActionKind.ROLLOUT, actor=actor, event="paused", reason=reason,
                      idempotency_key=idempotency_key, step=locked.step_index + 1)

    return action_once(kind=ActionKind.ROLLOUT, idempotency_key=idempotency_key, write=write,
                       request={"rollout": rollout.pk, "op": "pause"})


def rollout_resume(*, rollout: Rollout, actor, reason: str = "", idempotency_key: str | None = None):
    """The step's timer goes on from where the pause left it (once the tried workers are ready)."""
    actor = as_actor(actor)

    def write():
        locked = _lock(rollout, allowed=(RolloutStatus.PAUSED,), verb="resumed")
        Rollout.objects.filter(pk=locked.pk).update(status=RolloutStatus.RUNNING, step_started_at=None)
        return _event(locked, kind=ActionKind.ROLLOUT, actor=actor, event="resumed", reason=reason,
                      idempotency_key=idempotency_key, step=locked.step_index + 1)

    return action_once(kind=ActionKind.ROLLOUT, idempotency_key=idempotency_key, write=write,
                       request={"rollout": rollout.pk, "op": "resume"})


def rollout_step_advance(*, rollout: Rollout, from_step: int, actor, reason: str) -> bool:
    """The driver's move to the next step: claimed by a conditional UPDATE on the step it read, so that two
    drivers never advance the same step twice. False when another got there first (or the rollout changed)."""
    with transaction.atomic():
        num_updated = Rollout.objects.filter(pk=rollout.pk, status=RolloutStatus.RUNNING,
                                             step_index=from_step).update(
            step_index=from_step + 1, step_started_at=None, step_elapsed_s=0.0)
        if num_updated != 1:
            return False
        rollout.step_index = from_step + 1
        _event(rollout, kind=ActionKind.ROLLOUT, actor=actor, event="step", reason=reason,
               idempotency_key=f"rollout-{rollout.pk}-step-{from_step + 1}", step=from_step + 1,
               weight=rollout.current_step["weight"] if rollout.current_step else 100)
        enqueue_reconcile(rollout.deployment_id)
    return True


def rollout_complete(*, rollout: Rollout, actor, reason: str) -> bool:
    """An A/B experiment reached its end: completed, stable stays current, B's workers drain. Never promotes."""
    with transaction.atomic():
        num_updated = Rollout.objects.filter(pk=rollout.pk, status=RolloutStatus.RUNNING).update(
            status=RolloutStatus.COMPLETED, finished_at=timezone.now(), reason=reason)
        if num_updated != 1:
            return False
        _event(rollout, kind=ActionKind.ROLLOUT, actor=actor, event="completed", reason=reason,
               idempotency_key=f"rollout-{rollout.pk}-completed")
        enqueue_reconcile(rollout.deployment_id)
    return True
