"""Several hosts: a node registers the address other hosts reach it at, its workers are created with that host
(and bind to it), and a gateway's control-plane token travels in its environment, never on its command line."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.agent.node import node_register
from controlplane.models import Worker, WorkerRole, WorkerStatus
from controlplane.supervision.reconcile import reconcile_deployment

pytestmark = pytest.mark.django_db


def test_a_node_registers_the_address_it_is_reached_at():
    node = node_register(name="gpu-7", address="10.1.2.7")
    node.refresh_from_db()
    assert node.address == "10.1.2.7" and node.queue == "node.gpu-7"


def test_workers_are_created_on_their_node_address_and_bind_to_it(deployment, online_node, sent):
    online_node.address = "10.1.2.7"
    online_node.save(update_fields=["address"])
    reconcile_deployment(deployment_id=deployment.id)
    workers = list(Worker.objects.filter(deployment=deployment))
    assert workers and {w.host for w in workers} == {"10.1.2.7"}
    worker = next(w for w in workers if w.role != WorkerRole.GATEWAY)
    argv = launch.argv_for(worker, 41234)
    assert argv[argv.index("--host") + 1] == "10.1.2.7"


def test_the_gateway_token_is_in_its_environment_not_its_argv(deployment, online_node):
    gateway = Worker.objects.create(deployment=deployment, role=WorkerRole.GATEWAY, node=online_node,
                                    port=deployment.gateway_port, status=WorkerStatus.PENDING)
    argv = launch.argv_for(gateway, deployment.gateway_port or 8001)
    env = launch.env_for(gateway)
    assert "--token" not in argv
    from controlplane.auth import Role, has_role
    from controlplane.services.tokens import token_user

    assert has_role(token_user(env["TANDEM_CONTROL_PLANE_TOKEN"]), Role.VIEWER)
    assert all(env["TANDEM_CONTROL_PLANE_TOKEN"] not in part for part in argv)
