"""Shared control-plane fixtures: a user of each role and an outsider (signed in, no role), API clients holding
their tokens, a model folder, a deployment, a worker factory and real HTTP peers for scrapes and probes
(`metrics_servers`). Unit tests never run reconcile: services enqueue it with transaction.on_commit, which a
non-transactional django_db test never commits."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_cache():
    """The cache counts failed token lookups per client address (all tests share 127.0.0.1): each test starts
    with none."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def make_user(db):
    from django.contrib.auth import get_user_model

    from controlplane.auth import Role, set_role

    def make(username: str, role: str | None) -> object:
        # No password: hashing one costs ~0.2 s of PBKDF2 and tests sign in with tokens or force_login.
        user = get_user_model().objects.create_user(username=username, password=None)
        if role is not None:
            set_role(user, Role.parse(role))
        return user

    return make


@pytest.fixture
def viewer(make_user):
    return make_user("vera-viewer", "viewer")


@pytest.fixture
def operator(make_user):
    return make_user("otto-operator", "operator")


@pytest.fixture
def admin(make_user):
    return make_user("ada-admin", "admin")


@pytest.fixture
def outsider(make_user):
    """Authenticated, but in no role group."""
    return make_user("olga-outsider", None)


@pytest.fixture
def api_for(db):
    """api_for(user) → an APIClient sending `Authorization: Token <key>` for that user (None: anonymous)."""
    from rest_framework.test import APIClient

    from controlplane.services.tokens import token_issue

    def make(user) -> APIClient:
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=user, name='test')}")
        return client

    return make


@pytest.fixture
def anon_api(api_for):
    return api_for(None)


@pytest.fixture
def viewer_api(api_for, viewer):
    return api_for(viewer)


@pytest.fixture
def operator_api(api_for, operator):
    return api_for(operator)


@pytest.fixture
def admin_api(api_for, admin):
    return api_for(admin)


@pytest.fixture
def outsider_api(api_for, outsider):
    return api_for(outsider)


@pytest.fixture
def model_dir(tmp_path):
    """A folder that passes model_path validation (config.json present). Unit tests never load it."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.fixture
def node(db):
    from controlplane.models import Node

    return Node.objects.create(name="local", hostname="localhost")


@pytest.fixture
def make_deployment(db, admin, model_dir):
    """make_deployment(name, mode=..., replicas=..., ...) through the real service; returns the Deployment."""
    from tests.procs import free_port

    from controlplane.services import deployment_create

    def make(name: str = "demo", *, mode: str = "disaggregated", **kwargs):
        kwargs.setdefault("model_path", str(model_dir))
        kwargs.setdefault("gateway_port", free_port())
        action = deployment_create(name=name, mode=mode, actor=admin, **kwargs)
        deployment = action.deployment
        deployment.refresh_from_db()
        return deployment

    return make


@pytest.fixture
def deployment(make_deployment):
    """`demo`: disaggregated, 1 prefill + 1 decode, min 1, max 8, revision 1."""
    return make_deployment("demo")


@pytest.fixture
def make_worker(db, node):
    """make_worker(deployment, role, status=..., revision=..., port=...) inserts a Worker row as supervision would."""
    from controlplane.models import Pool, Worker, WorkerRole

    def make(deployment, role: str = "decode", *, status: str = "ready", revision=None, port: int | None = None,
             node=node, **fields) -> Worker:
        pool = None if role == WorkerRole.GATEWAY else Pool.objects.get(deployment=deployment, role=role)
        if revision is None and role != WorkerRole.GATEWAY:
            revision = deployment.current_revision
        if port is None:
            port = 41000 + Worker.objects.count()
        return Worker.objects.create(deployment=deployment, pool=pool, role=role, revision=revision, node=node,
                                     status=status, port=port, pid=10_000 + port, **fields)

    return make


@pytest.fixture
def second_revision(deployment, admin, model_dir):
    """Give `deployment` a revision 2 (current) whose rollout has finished, so a rollback is allowed."""
    from controlplane.services import action_succeed, revision_create

    action = revision_create(deployment=deployment, actor=admin, engine_settings={"threads": 2},
                             comment="two threads")
    action_succeed(action_id=action.pk)
    deployment.refresh_from_db()
    return deployment.current_revision


@pytest.fixture
def online_node(node):
    from django.utils import timezone

    node.last_seen_at = timezone.now()
    node.save(update_fields=["last_seen_at"])
    return node


@pytest.fixture
def sent(monkeypatch):
    """Every task message sent, as (task short name, args, queue)."""
    from controlplane.agent import tasks as agent_tasks
    from controlplane.supervision import tasks as supervision_tasks

    messages: list[tuple[str, tuple, str | None]] = []
    for module, name in ((agent_tasks, "agent_start_worker"), (agent_tasks, "agent_stop_worker"),
                         (supervision_tasks, "reconcile_deployment"),
                         (supervision_tasks, "reconcile_shared_gateway")):
        task = getattr(module, name)

        def apply_async(args=(), kwargs=None, queue=None, _name=name, **options):
            messages.append((_name, tuple(args), queue))

        monkeypatch.setattr(task, "apply_async", apply_async)
        monkeypatch.setattr(task, "delay", lambda *args, _name=name: messages.append((_name, args, None)))
    return messages


@pytest.fixture
def metrics_servers():
    """Real aiohttp servers answering /metrics and /health on ephemeral ports (tests/controlplane/observability/
    servers.py), closed after the test."""
    from tests.controlplane.observability.servers import MetricsServers

    servers = MetricsServers()
    yield servers
    servers.close()
