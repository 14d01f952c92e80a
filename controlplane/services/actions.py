"""Who acts, and the audit-log rows of what they asked for: the one owner of the Action lifecycle.

Every write service records one Action row in the same transaction as its desired-state change, and enqueues a
reconcile after commit. Supervision (reconcile and its tasks) moves the action through running → succeeded/failed
with action_start / action_succeed / action_fail; nothing else writes Action rows.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.celery import RECONCILE_DEPLOYMENT, RECONCILE_SHARED_GATEWAY, task_send
from controlplane.errors import ControlPlaneError, conflict
from controlplane.models import Action, ActionStatus, ActorType
from controlplane.models.actions import UNFINISHED_STATUSES

TERMINAL_STATUSES = (ActionStatus.SUCCEEDED, ActionStatus.FAILED)


@dataclass(frozen=True, slots=True)
class Actor:
    """The who of an action: a user, an alert rule, the autoscaler, a webhook sender or the system itself."""

    type: str
    name: str
    user: object | None = None  # the User for ActorType.USER

    def __post_init__(self):
        if self.type not in ActorType.values:
            raise ValueError(f"unknown actor type {self.type!r}")
        if not self.name:
            raise ValueError("an actor needs a name")

    @classmethod
    def of_user(cls, user) -> "Actor":
        return cls(ActorType.USER.value, user.get_username(), user)

    @classmethod
    def system(cls, name: str = "system") -> "Actor":
        return cls(ActorType.SYSTEM.value, name)

    @classmethod
    def rule(cls, name: str) -> "Actor":
        return cls(ActorType.RULE.value, name)

    @classmethod
    def autoscaler(cls, name: str = "autoscaler") -> "Actor":
        return cls(ActorType.AUTOSCALER.value, name)

    @classmethod
    def webhook(cls, name: str) -> "Actor":
        return cls(ActorType.WEBHOOK.value, name)


def as_actor(actor) -> Actor:
    """Services accept an Actor or, for convenience, a User (the API and dashboard pass request.user)."""
    if isinstance(actor, Actor):
        return actor
    if actor is not None and getattr(actor, "is_authenticated", False):
        return Actor.of_user(actor)
    raise TypeError(f"actor must be an Actor or an authenticated user, not {actor!r}")


_USER_KEY = re.compile(r"^u\d+/")
KEY_MAX_LENGTH = 255  # Action.idempotency_key's column


def user_idempotency_key(user, key: str | None) -> str | None:
    """A client's Idempotency-Key scoped to its user ("u<id>/<key>"): two users' keys never meet (an admin reusing
    an operator's key must not get the operator's action). A key too long for the column with its scope is stored
    as its sha256."""
    if not key:
        return None
    scoped = f"u{user.pk}/{key}"
    if len(scoped) > KEY_MAX_LENGTH:
        scoped = f"u{user.pk}/sha256:{hashlib.sha256(key.encode()).hexdigest()}"
    return scoped


def shown_idempotency_key(stored: str | None) -> str | None:
    """The key as its client sent it (the stored one without its user scope); system keys as they are."""
    return _USER_KEY.sub("", stored, count=1) if stored else stored


def action_find(idempotency_key: str | None, *, kind: str | None = None) -> Action | None:
    """The action already recorded under this key, if any. With `kind`, a key first used for another kind of
    action is a client bug (the same key for two different requests): 409 rather than a silently wrong answer."""
    if not idempotency_key:
        return None
    action = Action.objects.filter(idempotency_key=idempotency_key).first()
    if action is not None and kind is not None and action.kind != kind:
        raise conflict(f"idempotency key {shown_idempotency_key(idempotency_key)!r} was already used for a "
                       f"{action.kind} action "
                       f"({action.pk}), not a {kind}", action_id=action.pk)
    return action


def action_create(*, kind: str, actor, deployment=None, worker=None, reason: str = "", params: dict | None = None,
                  status: str = ActionStatus.PENDING, idempotency_key: str | None = None,
                  result: dict | None = None) -> Action:
    """Insert one audit row. Call inside the caller's transaction, after action_find() found no duplicate.
    A row created running is started now; one created succeeded or failed (a record of something already done)
    is started and finished now."""
    actor = as_actor(actor)
    now = timezone.now()
    action = Action(
        kind=kind,
        deployment=deployment,
        deployment_name=deployment.name if deployment is not None else "",
        worker=worker,
        actor_type=actor.type,
        actor=actor.name[:150],
        user=actor.user,
        reason=reason or "",
        params=params or {},
        status=status,
        idempotency_key=idempotency_key or None,
        result=result or {},
        created_at=now,
        started_at=now if status != ActionStatus.PENDING else None,
        finished_at=now if status in TERMINAL_STATUSES else None,
    )
    try:
        # A savepoint: on PostgreSQL a failed INSERT would otherwise poison the caller's whole transaction.
        with transaction.atomic():
            action.save()
    except IntegrityError:
        if idempotency_key and Action.objects.filter(idempotency_key=idempotency_key).exists():
            # Another process recorded the same request between our look-up and our insert.
            raise DuplicateAction(Action.objects.get(idempotency_key=idempotency_key)) from None
        raise
    return action


def request_fingerprint(kind: str, request: dict) -> str:
    """sha256 of what was asked (the service's arguments as JSON, keys sorted; objects by their primary key)."""
    def plain(value):
        return getattr(value, "pk", None) or str(value)

    text = json.dumps({"kind": kind, **request}, sort_keys=True, default=plain, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def action_once(*, kind: str, idempotency_key: str | None, write: Callable[[], Action],
                request: dict | None = None) -> Action:
    """The frame of every write service: the action already recorded under the idempotency key is returned
    unchanged; else `write()` changes desired state and records its action (action_create) in one transaction.
    When a concurrent request records the same key first, its action is returned and this write rolls back.

    `request` is what was asked: the same key with a different request is a 422 naming the earlier action (a
    client bug that would otherwise silently get the answer to another request), whichever of two concurrent
    requests wins.
    """
    fingerprint = request_fingerprint(kind, request or {})
    existing = action_find(idempotency_key, kind=kind)
    if existing is not None:
        return _same_request(existing, fingerprint)
    try:
        with transaction.atomic():
            action = write()
            if idempotency_key and action.idempotency_key == idempotency_key:
                Action.objects.filter(pk=action.pk).update(request_fingerprint=fingerprint)
                action.request_fingerprint = fingerprint
            return action
    except DuplicateAction as dup:
        return _same_request(dup.action, fingerprint)


def _same_request(action: Action, fingerprint: str) -> Action:
    if action.request_fingerprint and action.request_fingerprint != fingerprint:
        raise ControlPlaneError(
            f"idempotency key {shown_idempotency_key(action.idempotency_key)!r} was already used for a different "
            f"request (action "
            f"{action.pk}); use a new key for a new request", status=422, code="idempotency_key_reused",
            extra={"action_id": action.pk})
    return action


class DuplicateAction(Exception):
    """Raised by action_create when the idempotency key is already taken; services return `.action`."""

    def __init__(self, action: Action):
        super().__init__(f"action {action.pk} already has this idempotency key")
        self.action = action


def _finish(action_id: int, *, status: str, from_statuses, **fields) -> bool:
    # A conditional UPDATE claims the transition: a task that runs twice finishes the action once.
    num_updated = Action.objects.filter(pk=action_id, status__in=from_statuses).update(status=status, **fields)
    return num_updated == 1


def action_start(*, action_id: int) -> bool:
    """pending → running. False if another process got there first (or it already finished)."""
    return _finish(action_id, status=ActionStatus.RUNNING, from_statuses=[ActionStatus.PENDING],
                   started_at=timezone.now())


def action_succeed(*, action_id: int, result: dict | None = None) -> bool:
    """pending|running → succeeded, with what was done in `result`."""
    now = timezone.now()
    action = Action.objects.filter(pk=action_id).only("started_at").first()
    fields = {"finished_at": now, "result": result or {}}
    if action is not None and action.started_at is None:
        fields["started_at"] = now
    return _finish(action_id, status=ActionStatus.SUCCEEDED,
                   from_statuses=[ActionStatus.PENDING, ActionStatus.RUNNING], **fields)


def action_params_update(*, action_id: int, params: dict) -> bool:
    """A running action's params replaced by what it has learned since it started (a health hold's latest pass).
    False when it is no longer running."""
    return Action.objects.filter(pk=action_id, status=ActionStatus.RUNNING).update(params=params) == 1


def action_fail(*, action_id: int, error: str, result: dict | None = None) -> bool:
    """pending|running → failed, with the error stored on the row (never swallowed)."""
    now = timezone.now()
    action = Action.objects.filter(pk=action_id).only("started_at").first()
    fields = {"finished_at": now, "error": error, "result": result or {}}
    if action is not None and action.started_at is None:
        fields["started_at"] = now
    return _finish(action_id, status=ActionStatus.FAILED,
                   from_statuses=[ActionStatus.PENDING, ActionStatus.RUNNING], **fields)


def worker_actions_finish(*, worker_id: int, kind: str, succeeded: bool, error: str = "") -> int:
    """Finish the actions of one kind on a worker whose outcome is now known: on success the running ones (a
    restart is done once the worker is ready again); on failure every unfinished one (a worker given up on will
    not carry out a restart still pending either). Returns the number of rows finished."""
    statuses = (ActionStatus.RUNNING,) if succeeded else UNFINISHED_STATUSES
    return Action.objects.filter(worker_id=worker_id, kind=kind, status__in=statuses).update(
        status=ActionStatus.SUCCEEDED if succeeded else ActionStatus.FAILED, error=error,
        finished_at=timezone.now(),
    )


def enqueue_reconcile(deployment_id: int) -> None:
    """After this transaction commits, ask the control worker to reconcile the deployment (never before: the task
    must see the rows). Unit tests never run the callback: a non-transactional test never commits."""

    def send() -> None:
        task_send(RECONCILE_DEPLOYMENT, args=(deployment_id,))

    # robust: the change is committed by now; a broker that is down must not turn it into a 500. The periodic
    # reconcile_all (Celery beat) picks the deployment up anyway; the failure is logged.
    transaction.on_commit(send, robust=True)


def enqueue_shared_gateway_reconcile(gateway_id: int) -> None:
    """As enqueue_reconcile, for a shared gateway's process (controlplane.supervision.shared_gateways)."""
    transaction.on_commit(lambda: task_send(RECONCILE_SHARED_GATEWAY, args=(gateway_id,)), robust=True)
