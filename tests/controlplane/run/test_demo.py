"""What `make run` sets up: the admin user (password from the environment or generated once, only its hash
stored) and the `demo` deployment, created once and rolled to a new revision when the demo model changes."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from controlplane.models import Deployment
from controlplane.run.demo import admin_ensure, demo_deployment_ensure


@pytest.fixture
def fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_first_run_generates_an_admin_password_and_stores_only_its_hash(db, settings, fast_hashing, tmp_path):
    settings.TANDEM_ADMIN_PASSWORD, settings.VAR_DIR = None, tmp_path
    login = admin_ensure()
    user = get_user_model().objects.get(username="admin")
    assert login.generated and len(login.password) >= 16 and user.is_superuser
    assert user.check_password(login.password) and login.password not in user.password
    again = admin_ensure()
    assert again.password is None  # never shown twice
    # The token the last run printed keeps working (a shell that kept it goes on); its key waits in var/, 0600.
    from controlplane.services.tokens import token_revoke_all, token_user

    assert again.token == login.token and token_user(again.token) == user
    assert oct((tmp_path / "admin_token").stat().st_mode & 0o777) == "0o600"
    # Revoked meanwhile (the admin revoked their tokens): the next run issues a new one.
    token_revoke_all(user=user)
    third = admin_ensure()
    assert third.token != login.token and token_user(third.token) == user


def test_the_admin_password_comes_from_the_environment_when_set(db, settings, fast_hashing, tmp_path):
    settings.TANDEM_ADMIN_PASSWORD, settings.VAR_DIR = "correct-horse-battery", tmp_path
    login = admin_ensure()
    assert not login.generated and get_user_model().objects.get(username="admin").check_password(
        "correct-horse-battery")
    again = admin_ensure()
    # Not shown again, but the next runs still say where the password comes from.
    assert again.password is None and again.from_env


def _model(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def test_the_demo_deployment_is_created_once(db, tmp_path, settings):
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    tiny = _model(tmp_path, "tiny")
    deployment, what = demo_deployment_ensure(tiny)
    assert what == "created" and deployment.gateway_port == settings.TANDEM_GATEWAY_PORT
    assert {p.role: p.desired_replicas for p in deployment.pools.all()} == {"prefill": 1, "decode": 1}
    assert demo_deployment_ensure(tiny)[1] == "exists"
    assert Deployment.objects.count() == 1


def test_a_changed_demo_model_rolls_the_demo_to_a_new_revision(db, tmp_path, settings):
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    demo_deployment_ensure(_model(tmp_path, "tiny"))
    deployment, what = demo_deployment_ensure(_model(tmp_path, "smollm2-135m"))
    deployment.refresh_from_db()
    assert what == "new revision for model smollm2-135m"
    assert deployment.current_revision.number == 2 and deployment.current_revision.model_path.endswith("smollm2-135m")


def test_the_demo_serves_its_model_in_the_models_own_dtype(db, tmp_path, settings):
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    deployment, _ = demo_deployment_ensure(_model(tmp_path, "smollm2-135m"))
    assert deployment.current_revision.dtype == "auto"


def test_a_demo_that_an_earlier_make_run_pinned_to_float32_rolls_to_auto_but_an_operators_choice_stays(
        db, tmp_path, settings, admin):
    from controlplane.models import Action
    from controlplane.services import action_succeed, deployment_create, revision_create
    from controlplane.services.actions import Actor
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    model = _model(tmp_path, "smollm2-135m")
    # What make run wrote before dtype auto existed.
    deployment_create(name="demo", mode="disaggregated", model_path=str(model), dtype="float32",
                      sampling_defaults={"temperature": 0.0}, replicas={"prefill": 1, "decode": 1},
                      gateway_port=settings.TANDEM_GATEWAY_PORT, actor=Actor.system("tandem_run"))
    deployment, what = demo_deployment_ensure(model)
    deployment.refresh_from_db()
    assert what == "new revision with dtype auto (was float32)"
    assert (deployment.current_revision.number, deployment.current_revision.dtype) == (2, "auto")

    action_succeed(action_id=Action.objects.get(kind="revision").pk)  # the rollout finished
    revision_create(deployment=deployment, actor=admin, dtype="float32", comment="the operator wants float32")
    deployment, what = demo_deployment_ensure(model)
    deployment.refresh_from_db()
    assert what == "exists" and deployment.current_revision.dtype == "float32"


def test_the_demo_answers_greedily_by_default(db, tmp_path, settings):
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    deployment, _ = demo_deployment_ensure(_model(tmp_path, "smollm2-135m"))
    assert deployment.sampling_defaults == {"temperature": 0.0, "max_tokens": 256}


def test_a_demo_of_before_sampling_defaults_gets_them_once_and_an_operators_choice_stays(db, tmp_path, settings,
                                                                                        operator):
    from controlplane.services import deployment_sampling_defaults_set
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    model = _model(tmp_path, "tiny")
    deployment, _ = demo_deployment_ensure(model)
    Deployment.objects.filter(pk=deployment.pk).update(sampling_defaults={})  # as a demo made before they existed
    deployment, what = demo_deployment_ensure(model)
    assert what == "greedy sampling defaults set"
    assert Deployment.objects.get(pk=deployment.pk).sampling_defaults == {"temperature": 0.0, "max_tokens": 256}
    deployment_sampling_defaults_set(deployment=deployment, sampling_defaults={}, actor=operator)
    assert demo_deployment_ensure(model)[1] == "exists"
    assert Deployment.objects.get(pk=deployment.pk).sampling_defaults == {}


def test_the_demo_node_is_labelled_so_that_both_demo_pools_are_placed_on_it_by_their_selector(db, tmp_path, settings):
    """make run's node agent registers this host with the label both demo pools select; a node without it gets no
    demo worker (the demo places its workers through selectors, as a fleet does)."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.agent.node import node_register
    from controlplane.models import Node
    from controlplane.run.demo import DEMO_NODE_LABELS
    from controlplane.run.stack import child_specs
    from controlplane.supervision.placement import placement_for
    from tests.procs import free_port

    settings.TANDEM_GATEWAY_PORT = free_port()
    deployment, _ = demo_deployment_ensure(_model(tmp_path, "tiny"))
    pools = {pool.role: pool for pool in deployment.pools.all()}
    assert {role: pool.node_selector for role, pool in pools.items()} == {"prefill": {"tandem.demo": "true"},
                                                                         "decode": {"tandem.demo": "true"}}
    # Another online node, unlabelled and emptier: the selector, not the spread, keeps the demo off it.
    Node.objects.create(name="elsewhere", last_seen_at=timezone.now() + timedelta(minutes=5))

    agent, = [spec for spec in child_specs(web_port=8000, node_name="local", var_dir=tmp_path,
                                           node_labels=DEMO_NODE_LABELS) if spec.name == "agent"]
    labels = dict(agent.argv[i + 1].split("=", 1) for i, arg in enumerate(agent.argv) if arg == "--label")
    assert labels == {"tandem.demo": "true"}
    node = node_register(name="local", labels=labels)  # what the agent does when it starts
    for role in ("prefill", "decode"):
        assert placement_for(pools[role]).node == node

    node.labels = {}
    node.save(update_fields=["labels"])
    placement = placement_for(pools["decode"])
    assert placement.node is None and placement.reason == "no online node matches tandem.demo=true"
