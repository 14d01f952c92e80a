"""A shared gateway's process is launched with `--shared-gateway NAME` on the shared gateway's port, each attached
deployment's worker key in TANDEM_WORKER_KEYS (never on its command line), a token of its own, and a log file that
is never a deployment's; the agent records whose keys it gave, for reconcile to restart it when one is missing."""
from __future__ import annotations

import json

import pytest

from controlplane.agent import launch
from controlplane.lib.worker_keys import deployment_worker_key
from controlplane.models import Deployment, SharedGateway, Worker, WorkerRole
from inference.gateway.config import SCRAPE_TOKEN_ENV, WORKER_KEYS_ENV
from inference.worker_secret import KEY_ENV

pytestmark = pytest.mark.django_db


@pytest.fixture
def front(deployment, make_deployment, online_node):
    gateway = SharedGateway.objects.create(name="front", port=41500, node=online_node)
    other = make_deployment("other")
    Deployment.objects.filter(pk__in=[deployment.pk, other.pk]).update(shared_gateway=gateway, gateway_port=None)
    return gateway


def _process(gateway, node) -> Worker:
    return Worker.objects.create(shared_gateway=gateway, role=WorkerRole.GATEWAY, node=node, port=gateway.port)


def test_it_serves_the_shared_gateway_by_name_on_its_port(front, online_node):
    worker = _process(front, online_node)
    argv = launch.argv_for(worker, launch.gateway_port(worker))
    assert argv[argv.index("--shared-gateway") + 1] == "front"
    assert "--deployment" not in argv
    assert argv[argv.index("--port") + 1] == "41500"
    assert launch.log_path_for(worker).name == f"shared-front-gateway-{worker.id}.log"


def test_each_attached_deployment_key_is_in_its_environment_only(front, deployment, online_node, monkeypatch):
    monkeypatch.setenv(WORKER_KEYS_ENV, "the agent's own")
    worker = _process(front, online_node)
    env = launch.env_for(worker)
    keys = json.loads(env[WORKER_KEYS_ENV])
    other = Deployment.objects.get(name="other")
    assert keys == {deployment.name: deployment_worker_key(deployment), "other": deployment_worker_key(other)}
    assert KEY_ENV not in env and env[SCRAPE_TOKEN_ENV] and env["TANDEM_CONTROL_PLANE_TOKEN"]
    argv = launch.argv_for(worker, 41500)
    assert all(key not in part for key in keys.values() for part in argv)


def test_the_keys_read_once_are_the_ones_it_gets(front, deployment, online_node):
    worker = _process(front, online_node)
    keys = launch.shared_gateway_keys(worker)
    Deployment.objects.filter(name="other").update(shared_gateway=None)  # detached between the read and the spawn
    env = launch.env_for(worker, worker_keys=keys)
    assert set(json.loads(env[WORKER_KEYS_ENV])) == {deployment.name, "other"}
    assert sorted(keys) == sorted(Deployment.objects.values_list("id", flat=True))
