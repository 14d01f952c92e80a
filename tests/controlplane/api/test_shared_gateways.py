"""Shared gateways through the REST API (docs/gateway.md, "Shared gateway"): create one (a bad value is a 400 naming
the field), attach a deployment that had its own gateway (its port given back, its base URL the shared one's),
detach it (a port of its own again), delete one (409 while it serves a deployment), and the one membership answer for
all its deployments that the gateway polls."""
from __future__ import annotations

import pytest

from tests.procs import free_port

pytestmark = pytest.mark.django_db


def _create(client, **fields):
    return client.post("/api/v1/gateways/", {"name": "front", "port": free_port(), **fields}, format="json")


def _field(response, status: int) -> str:
    assert response.status_code == status, response.content
    return response.json()["error"].get("field")


def test_it_creates_and_lists_a_shared_gateway(admin_api, viewer_api, node):
    port = free_port()
    created = _create(admin_api, port=port, node="local")
    assert created.status_code == 201, created.content
    assert created.json()["url"] == f"http://localhost:{port}" and created.json()["deployments"] == []
    assert [g["name"] for g in viewer_api.get("/api/v1/gateways/").json()] == ["front"]


@pytest.mark.parametrize(("fields", "field"), [
    ({"name": "Not A Slug"}, "name"),
    ({"port": 80}, "port"),
    ({"port": "8000"}, "port"),
    ({"node": "nowhere"}, "node"),
])
def test_a_bad_value_is_a_400_naming_the_field(admin_api, fields, field):
    assert _field(_create(admin_api, **fields), 400) == field


def test_a_taken_name_or_a_deployment_s_port_is_a_409(admin_api, deployment):
    assert _create(admin_api).status_code == 201
    assert _create(admin_api).status_code == 409
    assert _field(_create(admin_api, name="other", port=deployment.gateway_port), 409) == "port"


def test_a_viewer_cannot_create_one(viewer_api):
    assert _create(viewer_api).status_code == 403


def test_attaching_a_deployment_with_its_own_gateway_gives_its_port_back(admin_api, deployment):
    gateway = _create(admin_api).json()
    attached = admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "front"}, format="json")
    assert attached.status_code == 200, attached.content
    body = attached.json()
    assert body["shared_gateway"] == "front" and body["gateway_port"] is None
    assert body["gateway_url"] == gateway["url"]  # which base URL serves it now
    assert admin_api.get("/api/v1/gateways/front/").json()["deployments"] == ["demo"]
    unknown = admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "nope"}, format="json")
    assert unknown.status_code == 404
    stray = admin_api.put("/api/v1/deployments/demo/gateway", {"gateway": "front"}, format="json")
    assert stray.status_code == 400


def test_reconcile_stops_the_own_gateway_of_an_attached_deployment(admin_api, deployment, make_worker):
    from controlplane.models import Worker
    from controlplane.supervision.reconcile import reconcile_deployment

    own = make_worker(deployment, "gateway", status="ready")
    _create(admin_api)
    admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "front"}, format="json")
    summary = reconcile_deployment(deployment.id)
    assert own.id in summary["drained"] and Worker.objects.get(pk=own.pk).status == "draining"
    assert not Worker.objects.filter(deployment=deployment, role="gateway", status="pending").exists()


def test_detaching_gives_the_deployment_a_gateway_of_its_own_again(admin_api, deployment):
    _create(admin_api)
    admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "front"}, format="json")
    detached = admin_api.delete("/api/v1/deployments/demo/gateway")
    assert detached.status_code == 200, detached.content
    assert detached.json()["shared_gateway"] is None and detached.json()["gateway_port"] is not None
    assert admin_api.delete("/api/v1/deployments/demo/gateway").status_code == 409  # it has no shared gateway


def test_deleting_a_shared_gateway_that_serves_a_deployment_is_a_409(admin_api, deployment):
    _create(admin_api)
    admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "front"}, format="json")
    refused = admin_api.delete("/api/v1/gateways/front/")
    assert _field(refused, 409) == "deployments" and "demo" in refused.json()["error"]["message"]
    admin_api.delete("/api/v1/deployments/demo/gateway")
    assert admin_api.delete("/api/v1/gateways/front/").status_code == 204
    assert admin_api.get("/api/v1/gateways/front/").status_code == 404


def test_the_membership_answers_every_attached_deployment_in_one_response(admin_api, viewer_api, deployment,
                                                                        make_deployment, make_worker):
    chat = make_deployment("chat", mode="colocated")
    worker = make_worker(chat, "colocated", status="ready")
    make_deployment("alone", mode="colocated")  # not attached: not in the answer
    _create(admin_api)
    for name in ("demo", "chat"):
        admin_api.put(f"/api/v1/deployments/{name}/gateway", {"shared_gateway": "front"}, format="json")
    body = viewer_api.get("/api/v1/gateways/front/endpoints").json()
    assert body["gateway"] == "front"
    assert [d["deployment"] for d in body["deployments"]] == ["chat", "demo"]
    chat_answer = viewer_api.get("/api/v1/deployments/chat/endpoints").json()  # unchanged, and the same item
    assert body["deployments"][0] == chat_answer and chat_answer["groups"][0]["colocated"] == [worker.url]
    assert viewer_api.get("/api/v1/gateways/nope/endpoints").status_code == 404


def test_the_gateway_parses_the_membership_the_control_plane_answers(admin_api, viewer_api, deployment):
    from inference.gateway.shared_membership import parse_shared

    _create(admin_api)
    admin_api.put("/api/v1/deployments/demo/gateway", {"shared_gateway": "front"}, format="json")
    (attached,) = parse_shared(viewer_api.get("/api/v1/gateways/front/endpoints").json())
    assert (attached.name, attached.model, attached.error) == ("demo", "demo", None)


def test_the_one_answer_is_each_deployments_own_in_queries_that_do_not_grow_with_them(
        admin_api, viewer_api, admin, make_deployment, make_worker):
    """Tenants (a key allowed on one deployment only, one deployment requiring keys, admission settings on another)
    and a canary's traffic split come out as each deployment's own answer says, with the parts read once for all
    the deployments: a shared gateway of a large fleet polls every few seconds."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.models import Revision
    from controlplane.rollouts.models import Rollout, Strategy
    from controlplane.tenants.services import (deployment_access_set, deployment_admission_set, tenant_create,
                                               tenant_key_issue)

    names = ("d0", "d1", "d2", "d3")
    deployments = {name: make_deployment(name, mode="colocated") for name in names}
    for deployment in deployments.values():
        make_worker(deployment, "colocated", status="ready")
    canary = deployments["d1"]
    tried = Revision.objects.create(deployment=canary, number=2, model_path=canary.current_revision.model_path)
    make_worker(canary, "colocated", status="ready", revision=tried)
    Rollout.objects.create(deployment=canary, strategy=Strategy.CANARY, revision=tried,
                           stable_revision=canary.current_revision, steps=[{"weight": 25, "duration_s": 60}])
    acme = tenant_create(name="acme", priority_class="interactive", deployments=["d0"], actor=admin)
    tenant_key_issue(tenant=acme, actor=admin)
    deployment_access_set(deployment=canary, requires_key=True, actor=admin)
    deployment_admission_set(deployment=deployments["d2"], admission={"max_queued": 7}, actor=admin)
    _create(admin_api)

    def poll() -> tuple[dict, int]:
        with CaptureQueriesContext(connection) as queries:
            body = viewer_api.get("/api/v1/gateways/front/endpoints").json()
        return body, len(queries.captured_queries)

    for name in names[:2]:
        admin_api.put(f"/api/v1/deployments/{name}/gateway", {"shared_gateway": "front"}, format="json")
    _, num_queries_of_two = poll()
    for name in names[2:]:
        admin_api.put(f"/api/v1/deployments/{name}/gateway", {"shared_gateway": "front"}, format="json")
    body, num_queries_of_four = poll()
    assert num_queries_of_four == num_queries_of_two
    assert body["deployments"] == [viewer_api.get(f"/api/v1/deployments/{name}/endpoints").json() for name in names]
    d0, d1, d2, d3 = body["deployments"]
    assert d0["tenants"]["acme"]["allowed"] is True and d3["tenants"]["acme"]["allowed"] is False
    assert d1["requires_key"] is True and [g["traffic_weight"] for g in d1["groups"]] == [25, 75]
    assert d2["admission"] == {"max_queued": 7} and "admission" not in d3
