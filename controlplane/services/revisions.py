"""New revisions and rollbacks: both move `current_revision`, and reconcile replaces the workers of both pools by
a rolling replacement (start new, wait ready, drain old, stop old). One rollout per deployment at a time."""
from __future__ import annotations

from django.db.models import Max

from controlplane.errors import conflict, invalid
from controlplane.models import Action, ActionKind, ActionStatus, Deployment, Revision
from controlplane.rollout_provider import rollout_active
from controlplane.selectors import deployment_delete_pending, deployment_rollout_in_progress
from controlplane.services.actions import action_create, action_fail, action_once, as_actor, enqueue_reconcile
from controlplane.services.validation import (check_kv_cache_dtype, check_model_context, revision_dtype,
                                              validate_engine_settings, validate_model_path)


def lock_for_rollout(deployment: Deployment, *, preempt: bool = False) -> Deployment:
    """Lock the deployment row and refuse when it is being deleted or another rollout runs (409); with `preempt`
    (a rollback) a running replacement is no refusal: the caller supersedes it (`running_replacement`)."""
    deployment = (Deployment.objects.select_for_update(of=("self",)).select_related("current_revision")
                  .get(pk=deployment.pk))
    if deployment_delete_pending(deployment) is not None:
        raise conflict(f"deployment {deployment.name!r} is being deleted")
    running = deployment_rollout_in_progress(deployment)
    if running is not None and not preempt:
        raise conflict(
            f"a {running.kind} of deployment {deployment.name!r} is still in progress (action {running.pk}); "
            "wait for it to finish", action_id=running.pk)
    rollout = rollout_active(deployment)
    if rollout is not None:
        raise conflict(f"a {rollout.strategy} rollout of deployment {deployment.name!r} is {rollout.status} "
                       f"(rollout {rollout.pk}); promote or abort it first", rollout_id=rollout.pk)
    return deployment


def revision_fields_validate(deployment: Deployment, *, model_path, dtype, engine_settings) -> tuple:
    """(model_path, dtype, engine_settings) checked (400 naming the field); None where not given."""
    if model_path is not None:
        model_path = validate_model_path(model_path)
    if engine_settings is not None:
        engine_settings = validate_engine_settings(engine_settings, roles=deployment.roles)
        dtype = revision_dtype(dtype, engine_settings)
    elif dtype is not None:
        dtype = revision_dtype(dtype, {"common": {}})
    base = deployment.current_revision  # the new revision as it will be: what is not given is copied from it
    check_kv_cache_dtype(dtype if dtype is not None else base.dtype,
                         engine_settings if engine_settings is not None else base.engine_settings)
    check_model_context(model_path if model_path is not None else base.model_path,
                        engine_settings if engine_settings is not None else base.engine_settings)
    return model_path, dtype, engine_settings


def revision_add(*, deployment: Deployment, actor, model_path: str | None, dtype: str | None,
                 engine_settings: dict | None, comment: str = "") -> Revision:
    """The next revision, fields not given copied from the current one, checked by revision_fields_validate
    first. Not made current: revision_create does that; a canary or A/B rollout runs it beside the current one.
    Call inside the caller's transaction, with the deployment row locked."""
    base = deployment.current_revision
    number = (deployment.revisions.aggregate(n=Max("number"))["n"] or 0) + 1
    return Revision.objects.create(
        deployment=deployment, number=number,
        model_path=model_path if model_path is not None else base.model_path,
        dtype=dtype if dtype is not None else base.dtype,
        engine_settings=engine_settings if engine_settings is not None else dict(base.engine_settings),
        comment=comment or "", created_by=as_actor(actor).user)


def revision_create(*, deployment: Deployment, actor, model_path: str | None = None, dtype: str | None = None,
                    engine_settings: dict | None = None, comment: str = "", reason: str = "",
                    idempotency_key: str | None = None) -> Action:
    """Create the next revision (fields not given are copied from the current one) and make it current.

    `engine_settings`, when given, replaces the current settings as a whole: common and per-role parts (a flat dict
    is common), only the deployment's roles; `common.dtype` stands for `dtype`. The `revision` action is `running`
    until reconcile has replaced every worker of an older revision, then it succeeds. Returns the Action
    (action.params["revision"] is the new number).
    """
    actor = as_actor(actor)
    model_path, dtype, engine_settings = revision_fields_validate(
        deployment, model_path=model_path, dtype=dtype, engine_settings=engine_settings)

    def write() -> Action:
        nonlocal deployment  # re-read under the lock
        deployment = lock_for_rollout(deployment)
        base = deployment.current_revision
        previous = base.number if base is not None else None
        revision = revision_add(deployment=deployment, actor=actor, model_path=model_path, dtype=dtype,
                                engine_settings=engine_settings, comment=comment)
        number = revision.number
        action = action_create(
            kind=ActionKind.REVISION, actor=actor, deployment=deployment, reason=reason or comment,
            params={"from_revision": previous, "to_revision": number, "revision": number,
                    "model_path": revision.model_path, "dtype": revision.dtype,
                    "engine_settings": revision.engine_settings},
            status=ActionStatus.RUNNING, idempotency_key=idempotency_key)
        deployment.current_revision = revision
        deployment.save(update_fields=["current_revision"])
        enqueue_reconcile(deployment.pk)
        return action

    return action_once(kind=ActionKind.REVISION, idempotency_key=idempotency_key, write=write, request={
        "deployment": deployment.pk, "model_path": model_path, "dtype": dtype, "engine_settings": engine_settings,
        "comment": comment})


def deployment_rollback(*, deployment: Deployment, actor, revision_number: int | None = None, reason: str = "",
                        idempotency_key: str | None = None) -> Action:
    """Make an earlier revision current again (default: the highest-numbered one below the current).

    400 for an unknown revision or the current one; 409 while a canary or A/B rollout runs (promote or abort it).
    A revision, rollback or promotion whose replacement still runs is preempted: its action fails naming this
    rollback, whose params name it (`preempted`), and reconcile replaces the workers from where they are (the target
    revision's still serving stay; the superseded revision's drain once the target's are ready). The `rollback`
    action is `running` until reconcile has replaced every worker of another revision.
    """
    actor = as_actor(actor)
    if revision_number is not None and (isinstance(revision_number, bool) or not isinstance(revision_number, int)):
        raise invalid(f"revision must be a revision number, not {revision_number!r}", field="revision")

    def write() -> Action:
        nonlocal deployment  # re-read under the lock
        # The operator who rolls back is the one whose new revision is bad: a replacement still running (its new
        # workers ready, the old ones draining) is superseded, not waited for.
        deployment = lock_for_rollout(deployment, preempt=True)
        preempted = deployment_rollout_in_progress(deployment)
        current = deployment.current_revision
        current_number = current.number if current is not None else None
        if revision_number is None:
            target = (deployment.revisions.filter(number__lt=current_number or 0).order_by("-number").first())
            if target is None:
                raise invalid(f"deployment {deployment.name!r} has no revision before {current_number} to "
                              "roll back to", field="revision")
        else:
            target = deployment.revisions.filter(number=revision_number).first()
            if target is None:
                numbers = list(deployment.revisions.order_by("number").values_list("number", flat=True))
                raise invalid(f"deployment {deployment.name!r} has no revision {revision_number} "
                              f"(it has {numbers})", field="revision")
            if target.number == current_number:
                raise invalid(f"revision {revision_number} is already the current revision of "
                              f"{deployment.name!r}", field="revision")
        params = {"from_revision": current_number, "to_revision": target.number, "revision": target.number}
        if preempted is not None:
            params["preempted"] = {"action": preempted.pk, "kind": preempted.kind,
                                   "revision": (preempted.params or {}).get("revision")}
        action = action_create(kind=ActionKind.ROLLBACK, actor=actor, deployment=deployment, reason=reason,
                               params=params, status=ActionStatus.RUNNING, idempotency_key=idempotency_key)
        if preempted is not None:
            action_fail(action_id=preempted.pk, error=f"preempted by the rollback to revision {target.number} "
                                                      f"(action {action.pk})", result={"preempted_by": action.pk})
        deployment.current_revision = target
        deployment.save(update_fields=["current_revision"])
        enqueue_reconcile(deployment.pk)
        return action

    return action_once(kind=ActionKind.ROLLBACK, idempotency_key=idempotency_key, write=write,
                       request={"deployment": deployment.pk, "revision": revision_number})


def revision_model_checksum_record(*, revision: Revision, checksum: str) -> str:
    """The checksum of the model files the revision serves: `checksum` where none was recorded yet (its first worker's
    node agent read it from the folder), else the one recorded first. A conditional UPDATE: of two agents starting
    the revision's first workers at once, one records; the revision stays otherwise immutable."""
    Revision.objects.filter(pk=revision.pk, model_checksum="").update(model_checksum=checksum)
    return Revision.objects.values_list("model_checksum", flat=True).get(pk=revision.pk)
