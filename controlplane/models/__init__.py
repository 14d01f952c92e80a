"""The control plane's state: desired (deployments, revisions, pools) and actual (nodes, workers), plus the audit log
(actions). Services in controlplane.services write it; supervision (reconcile, health, agent) acts on it."""
from .actions import Action, ActionKind, ActionStatus, ActorType
from .deployments import Deployment, DeploymentMode, Pool, PoolRole, Revision
from .gateways import SharedGateway
from .nodes import Node
from .tokens import ApiToken
from .workers import Worker, WorkerPurpose, WorkerRole, WorkerStatus

__all__ = [
    "Action", "ActionKind", "ActionStatus", "ActorType",
    "Deployment", "DeploymentMode", "Pool", "PoolRole", "Revision", "SharedGateway",
    "Node", "ApiToken",
    "Worker", "WorkerPurpose", "WorkerRole", "WorkerStatus",
]
