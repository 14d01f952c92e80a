"""The node agent hands each worker its revision's worker secret and each gateway its deployment's worker key, in
the environment, never on the command line: workers of one revision share a secret, another revision's differs
(rotated with the revision), a gateway derives each revision's from its key, and another deployment's differ. A
secret in the agent's own environment is never passed on."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.models import Worker, WorkerRole
from controlplane.services import action_succeed, revision_create
from inference.worker_secret import KEY_ENV, SECRET_ENV, revision_secret

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_revision(deployment, admin):
    action = revision_create(deployment=deployment, actor=admin, engine_settings={"max_num_seqs": 8},
                             comment="another")
    action_succeed(action_id=action.pk)
    deployment.refresh_from_db()
    return deployment.current_revision


def _worker(deployment, node, role: str, revision, worker_id: int) -> Worker:
    return Worker(deployment=deployment, role=role, node=node, id=worker_id, revision=revision)


def test_workers_of_a_revision_share_a_secret_that_the_gateway_derives_from_its_key(deployment, online_node,
                                                                                     second_revision, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "the agent's own")
    monkeypatch.setenv(KEY_ENV, "the agent's own")
    first = deployment.revisions.get(number=1)
    prefill = launch.env_for(_worker(deployment, online_node, "prefill", first, 91))
    decode = launch.env_for(_worker(deployment, online_node, "decode", first, 92))
    newer = launch.env_for(_worker(deployment, online_node, "decode", second_revision, 93))
    gateway = launch.env_for(Worker(deployment=deployment, role=WorkerRole.GATEWAY, node=online_node, id=94))
    assert prefill[SECRET_ENV] == decode[SECRET_ENV] != newer[SECRET_ENV]
    assert "the agent's own" not in (prefill[SECRET_ENV], newer[SECRET_ENV], gateway[KEY_ENV])
    assert KEY_ENV not in prefill and SECRET_ENV not in gateway  # a worker never holds the key of all revisions
    assert revision_secret(gateway[KEY_ENV], 1) == prefill[SECRET_ENV]
    assert revision_secret(gateway[KEY_ENV], second_revision.number) == newer[SECRET_ENV]


def test_secrets_never_appear_on_a_command_line(deployment, online_node):
    revision = deployment.current_revision
    worker = _worker(deployment, online_node, "prefill", revision, 95)
    gateway = Worker(deployment=deployment, role=WorkerRole.GATEWAY, node=online_node, id=96)
    for row in (worker, gateway):
        env, argv = launch.env_for(row), launch.argv_for(row, 41000)
        secret = env.get(SECRET_ENV) or env[KEY_ENV]
        assert all(secret not in part for part in argv)


def test_another_deployment_gets_other_secrets(deployment, make_deployment, online_node):
    other = make_deployment("other")
    mine = launch.env_for(_worker(deployment, online_node, "decode", deployment.current_revision, 97))
    theirs = launch.env_for(_worker(other, online_node, "decode", other.current_revision, 98))
    assert deployment.current_revision.number == other.current_revision.number
    assert mine[SECRET_ENV] != theirs[SECRET_ENV]


def test_a_gateway_gets_the_scrape_token_that_operators_read_from_the_api(deployment, online_node, viewer_api,
                                                                          monkeypatch):
    from inference.gateway.config import SCRAPE_TOKEN_ENV

    monkeypatch.setenv(SCRAPE_TOKEN_ENV, "the agent's own")
    first = deployment.revisions.get(number=1)
    gateway = launch.env_for(Worker(deployment=deployment, role=WorkerRole.GATEWAY, node=online_node, id=95))
    worker = launch.env_for(_worker(deployment, online_node, "decode", first, 96))
    answer = viewer_api.get("/api/v1/prometheus/scrape-token")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain")
    assert gateway[SCRAPE_TOKEN_ENV] == answer.content.decode() != "the agent's own"
    assert SCRAPE_TOKEN_ENV not in worker  # workers' pages name no tenant: they need none
