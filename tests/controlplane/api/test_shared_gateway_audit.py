"""Each change to a shared gateway is an action row of kind `gateway` (params.event: create, attach, detach,
delete) by the user who made it; a shared gateway whose process is still stopping is not deleted (409), since its
process row goes with it."""
from __future__ import annotations

import pytest

from controlplane.models import Action, ActionKind, SharedGateway, Worker, WorkerRole, WorkerStatus
from tests.procs import free_port

pytestmark = pytest.mark.django_db


def test_create_attach_detach_and_delete_are_each_an_action_row(admin_api, admin, deployment):
    assert admin_api.post("/api/v1/gateways/", {"name": "front", "port": free_port()},
                          format="json").status_code == 201
    assert admin_api.put(f"/api/v1/deployments/{deployment.name}/gateway", {"shared_gateway": "front"},
                         format="json").status_code == 200
    assert admin_api.put(f"/api/v1/deployments/{deployment.name}/gateway", {"shared_gateway": "front"},
                         format="json").status_code == 200  # attached already: nothing new to record
    assert admin_api.delete(f"/api/v1/deployments/{deployment.name}/gateway").status_code == 200
    assert admin_api.delete("/api/v1/gateways/front/").status_code == 204
    rows = list(Action.objects.filter(kind=ActionKind.GATEWAY).order_by("id"))
    assert [(row.params["event"], row.deployment_name) for row in rows] == [
        ("create", ""), ("attach", deployment.name), ("detach", deployment.name), ("delete", "")]
    assert all(row.user == admin and row.params["shared_gateway"] == "front" for row in rows)


def test_a_shared_gateway_whose_process_still_runs_is_not_deleted(admin_api, node):
    gateway = SharedGateway.objects.create(name="front", port=free_port())
    Worker.objects.create(shared_gateway=gateway, role=WorkerRole.GATEWAY, node=node, status=WorkerStatus.DRAINING)
    response = admin_api.delete("/api/v1/gateways/front/")
    assert response.status_code == 409, response.content
    assert SharedGateway.objects.filter(name="front").exists()
