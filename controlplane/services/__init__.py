"""Writes. Keyword-only functions named noun_verb; each validates, changes desired state and records its Action in
one transaction, then enqueues a reconcile after commit. They raise ControlPlaneError (400/404/409)."""
from .actions import (Actor, DuplicateAction, action_create, action_fail, action_find, action_once, action_start,
                      action_succeed, as_actor, enqueue_reconcile)
from .deployments import deployment_create, deployment_delete, deployment_sampling_defaults_set, gateway_port_pick
from .objectives import deployment_objectives_set
from .pools import PoolAtBound, pool_scale, pool_scale_by
from .revisions import deployment_rollback, revision_create
from .workers import worker_drain, worker_restart

__all__ = [
    "Actor", "DuplicateAction", "action_create", "action_fail", "action_find", "action_once", "action_start", "action_succeed",
    "as_actor", "enqueue_reconcile",
    "deployment_create", "deployment_delete", "deployment_sampling_defaults_set", "gateway_port_pick",
    "deployment_objectives_set",
    "PoolAtBound", "pool_scale", "pool_scale_by",
    "deployment_rollback", "revision_create",
    "worker_drain", "worker_restart",
]
