"""Reads shared by the API, the dashboard, services and supervision."""
from __future__ import annotations

from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet

from controlplane.errors import not_found
from controlplane.models import (Action, ActionKind, ActionStatus, Deployment, Node, Pool, Revision, SharedGateway,
                                 Worker, WorkerPurpose, WorkerRole, WorkerStatus)
from controlplane.models.actions import UNFINISHED_STATUSES
from controlplane.rollout_provider import rollouts_latest, traffic_weights, variant_names
from controlplane.tenant_provider import gateway_access, gateway_access_many
from inference.engines import TANDEM, engine_of

# Ids are 64-bit: a bigger number in a URL or filter is not an id (and would overflow the database driver).
MAX_ID = 2**63 - 1
ROLLOUT_KINDS = (ActionKind.ROLLBACK, ActionKind.REVISION, ActionKind.PROMOTE)


def _could_be_name(name) -> bool:
    # Names are slugs of at most 63 characters; anything else (a NUL byte, which PostgreSQL refuses in text,
    # a 3,000-character path segment) cannot exist, so it is a 404 without a query.
    return isinstance(name, str) and 0 < len(name) <= 63 and "\x00" not in name


def node_get(name: str) -> Node:
    node = Node.objects.filter(name=name).first() if _could_be_name(name) else None
    if node is None:
        raise not_found(f"node {name!r} does not exist")
    return node


_unfinished_deletes = Action.objects.filter(deployment=OuterRef("pk"), kind=ActionKind.DELETE,
                                           status__in=UNFINISHED_STATUSES)


def deployment_list() -> QuerySet[Deployment]:
    ready = Count("workers", filter=Q(workers__status=WorkerStatus.READY))
    pools = Pool.objects.annotate(
        num_ready=Count("workers", filter=Q(workers__status=WorkerStatus.READY)),
        num_live=Count("workers", filter=Q(workers__status__in=[WorkerStatus.PENDING, WorkerStatus.STARTING,
                                                                 WorkerStatus.READY])),
    ).order_by("-role")  # prefill, decode, colocated: the order a request flows through
    return (Deployment.objects.select_related("current_revision", "gateway_node", "shared_gateway__node", "created_by")
            .prefetch_related(Prefetch("pools", queryset=pools))
            .annotate(num_ready_workers=ready, is_deleting=Exists(_unfinished_deletes)))


def deployment_get(name: str, *, for_update: bool = False) -> Deployment:
    qs = Deployment.objects.select_for_update() if for_update else deployment_list()
    deployment = qs.filter(name=name).first() if _could_be_name(name) else None
    if deployment is None:
        raise not_found(f"deployment {name!r} does not exist")
    return deployment


def deployment_row(name: str) -> Deployment:
    """The deployment's own row and its current revision, without the worker counts, pools and delete flag that
    deployment_get annotates: for reads that need none of them, such as the membership every gateway polls every
    2 s (with many deployments, deployment_get's annotations were a large share of each poll's time in the web tier,
    as py-spy showed)."""
    deployment = (Deployment.objects.select_related("current_revision").filter(name=name).first()
                  if _could_be_name(name) else None)
    if deployment is None:
        raise not_found(f"deployment {name!r} does not exist")
    return deployment


def deployment_delete_pending(deployment: Deployment) -> Action | None:
    """The unfinished delete action of a deployment (reconcile stops its workers, then deletes the row)."""
    return (Action.objects.filter(deployment=deployment, kind=ActionKind.DELETE, status__in=UNFINISHED_STATUSES)
            .order_by("id").first())


def deployment_rollout_in_progress(deployment: Deployment) -> Action | None:
    """The unfinished rollback, new-revision rollout or promotion (its rolling replacement) of a deployment."""
    return (Action.objects.filter(deployment=deployment, kind__in=ROLLOUT_KINDS, status__in=UNFINISHED_STATUSES)
            .order_by("id").first())


def revision_list(deployment: Deployment) -> QuerySet[Revision]:
    return deployment.revisions.select_related("created_by").order_by("-number")


def revision_get(deployment: Deployment, number: int) -> Revision | None:
    return deployment.revisions.filter(number=number).first()


def _given(**filters) -> dict:
    """The filters a caller gave (an empty or missing query parameter filters nothing)."""
    return {field: value for field, value in filters.items() if value}


def worker_list(*, deployment: str | None = None, role: str | None = None, status: str | None = None,
                node: str | None = None, shared_gateway: str | None = None) -> QuerySet[Worker]:
    qs = Worker.objects.select_related("deployment", "shared_gateway", "node", "revision").order_by("id")
    return qs.filter(**_given(deployment__name=deployment, role=role, status=status, node__name=node,
                              shared_gateway__name=shared_gateway))


def worker_get(worker_id: int, *, for_update: bool = False) -> Worker:
    if not isinstance(worker_id, int) or not 0 < worker_id <= MAX_ID:
        raise not_found(f"worker {worker_id!r} does not exist")
    qs = Worker.objects.select_for_update(of=("self",)) if for_update else Worker.objects
    worker = qs.select_related("deployment", "shared_gateway", "node", "revision").filter(pk=worker_id).first()
    if worker is None:
        raise not_found(f"worker {worker_id} does not exist")
    return worker


def action_list(*, deployment: str | None = None, actor: str | None = None, actor_type: str | None = None,
                kind: str | None = None, status: str | None = None, worker: int | None = None) -> QuerySet[Action]:
    qs = Action.objects.order_by("-created_at", "-id")
    return qs.filter(**_given(deployment_name=deployment, actor=actor, actor_type=actor_type, kind=kind,
                              status=status, worker_id=worker))


def action_get(action_id: int) -> Action:
    if not isinstance(action_id, int) or not 0 < action_id <= MAX_ID:
        raise not_found(f"action {action_id!r} does not exist")
    action = Action.objects.filter(pk=action_id).first()
    if action is None:
        raise not_found(f"action {action_id} does not exist")
    return action


def health_hold_get() -> dict | None:
    """The health pass's running `hold` action (supervision.probe_hold opens and closes it), for /healthz and the
    overview page: {"since", "reason", "latest"}, or None."""
    running = (Action.objects.filter(kind=ActionKind.HOLD, status=ActionStatus.RUNNING)
               .order_by("-id").values("started_at", "reason", "params").first())
    if running is None:
        return None
    return {"since": running["started_at"].isoformat() if running["started_at"] else None,
            "reason": running["reason"], "latest": (running["params"] or {}).get("latest")}


def engine_membership(revision, role: str) -> dict:
    """What the gateway needs to know of a group whose workers run another engine than Tandem's (their /health says
    only "up"): the engine, the sequences each runs at once (its admission slots) and whether it caches prefixes.
    Nothing for Tandem's own workers, whose /health says it all."""
    engine = engine_of(revision.engine_settings)
    if engine == TANDEM:
        return {}
    settings = revision.settings_for(role)
    return {"engine": engine, "max_num_seqs": settings.get("max_num_seqs"),
            "prefix_caching": settings.get("prefix_caching", True)}


def deployment_endpoints(deployment: Deployment) -> dict:
    """The gateway membership (docs/contracts.md "Control plane → gateway membership"): ready serving workers (never
    a profile run's) by revision,
    newest revision first, each group with the routing weight of each of its workers (Pool.routing_weight). While a
    canary or A/B rollout concerns the groups, each carries its `traffic_weight` (0-100) and `variant`
    (rollout_provider.traffic_weights); otherwise neither key is there and the newest complete group serves. A group
    whose decode workers take their KV pushes elsewhere (Worker.kv_port: a chaos KV fault's proxy) carries
    `kv_urls` (decode URL → KV URL), which the gateway hands the prefill worker instead of the decode URL."""
    return _endpoints(deployment, list(_serving_workers(Worker.objects.filter(deployment=deployment))),
                      rollouts_latest([deployment.pk]).get(deployment.pk), gateway_access(deployment))


def _serving_workers(workers: QuerySet[Worker]) -> QuerySet[Worker]:
    return (workers.filter(status=WorkerStatus.READY, port__isnull=False, revision__isnull=False,
                           purpose=WorkerPurpose.SERVING)
            .exclude(role=WorkerRole.GATEWAY)
            .select_related("revision", "pool", "node").order_by("id"))


def _endpoints(deployment: Deployment, workers: list[Worker], rollout, access: dict) -> dict:
    """deployment_endpoints from what it reads: the serving workers, the latest rollout (or None) and the tenants'
    part (tenant_provider)."""
    groups: dict[int, dict] = {}
    for worker in workers:
        group = groups.get(worker.revision.number)
        if group is None:
            group = groups[worker.revision.number] = {"revision": worker.revision.number, "prefill": [],
                                                      "decode": [], "colocated": [], "weights": {},
                                                      **engine_membership(worker.revision, worker.role)}
        group[worker.role].append(worker.url)
        group["weights"][worker.url] = worker.pool.routing_weight(worker.node) if worker.pool else 1
        if worker.kv_port is not None and worker.role == WorkerRole.DECODE:
            group.setdefault("kv_urls", {})[worker.url] = f"http://{worker.host}:{worker.kv_port}"
    split = traffic_weights(deployment, set(groups), rollout) if groups else None
    if split is not None:
        variants = variant_names(deployment, rollout)
        for number, group in groups.items():
            group["traffic_weight"] = split.get(number, 0)
            if number in variants:
                group["variant"] = variants[number]
    return {
        "deployment": deployment.name,
        "model": deployment.name,
        "mode": deployment.mode,
        "groups": [groups[number] for number in sorted(groups, reverse=True)],
        "sampling_defaults": dict(deployment.sampling_defaults or {}),
        # The gateway sends the ITL objective to the workers, whose decode batch it bounds (batch_limit.py).
        "objectives": {"itl_p99_seconds": (deployment.objectives or {}).get("itl_p99_seconds")},
        **access,  # `requires_key` and `tenants`, when the deployment has any (tenant_provider)
    }


def shared_gateway_get(name: str) -> SharedGateway:
    gateway = (SharedGateway.objects.select_related("node").filter(name=name).first()
               if _could_be_name(name) else None)
    if gateway is None:
        raise not_found(f"shared gateway {name!r} does not exist")
    return gateway


def shared_gateway_endpoints(gateway: SharedGateway) -> dict:
    """A shared gateway's membership (docs/contracts.md "Shared gateway membership"): every attached deployment's
    answer, as deployment_endpoints gives it, in one response for one poll."""
    # Each part read once for all of them: the gateways of a large fleet poll every few seconds, and per deployment
    # the same reads cost their queries' overhead as many times over (docs/simulated-fleet.md).
    deployments = list(Deployment.objects.select_related("current_revision").filter(shared_gateway=gateway)
                       .order_by("name"))
    ids = [deployment.pk for deployment in deployments]
    workers: dict[int, list[Worker]] = {pk: [] for pk in ids}
    for worker in _serving_workers(Worker.objects.filter(deployment_id__in=ids)):
        workers[worker.deployment_id].append(worker)
    rollouts, access = rollouts_latest(ids), gateway_access_many(deployments)
    return {"gateway": gateway.name,
            "deployments": [_endpoints(d, workers[d.pk], rollouts.get(d.pk), access[d.pk]) for d in deployments]}
