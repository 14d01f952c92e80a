"""The node agent starts a gateway with a --quota-state file of its deployment and port, so that the gateway started
again in its place carries its tenants' minute of usage over (inference/gateway/quota_state.py)."""
from __future__ import annotations

import pytest
from django.conf import settings

from controlplane.agent import launch
from controlplane.models import Worker, WorkerRole, WorkerStatus
from inference.gateway.config import parse_args

pytestmark = pytest.mark.django_db


def test_a_gateway_gets_a_quota_state_file_of_its_deployment_and_port(deployment, online_node):
    gateway = Worker.objects.create(deployment=deployment, role=WorkerRole.GATEWAY, node=online_node,
                                    port=8123, status=WorkerStatus.PENDING)
    argv = launch.argv_for(gateway, 8123)
    path = argv[argv.index("--quota-state") + 1]
    assert path == str(settings.VAR_DIR / "gateway-state" / "demo-8123.quota.json")
    # The gateway takes the command line as given (after `python -m inference.gateway`).
    config = parse_args([*argv[argv.index("inference.gateway") + 1:], "--token", "t"])
    assert str(config.quota_state) == path
