"""Workers: list with filters, detail, restart, drain."""
from __future__ import annotations

import pytest

from controlplane.models import Action

pytestmark = pytest.mark.django_db

FIELDS = {"id", "deployment", "role", "status", "pid", "host", "port", "url", "node", "revision", "dtype",
          "restart_count", "last_error", "created_at", "started_at", "ready_at"}


@pytest.fixture
def workers(deployment, make_worker, make_deployment):
    other = make_deployment("other", mode="colocated")
    return {
        "prefill": make_worker(deployment, "prefill", status="ready"),
        "decode": make_worker(deployment, "decode", status="ready", dtype="bfloat16"),
        "decode_failed": make_worker(deployment, "decode", status="failed", last_error="exit 1", restart_count=5),
        "gateway": make_worker(deployment, "gateway", status="ready"),
        "other": make_worker(other, "colocated", status="starting"),
    }


def ids(response):
    return [w["id"] for w in response.json()]


def test_the_list_has_the_documented_fields(viewer_api, workers):
    listed = viewer_api.get("/api/v1/workers/").json()
    assert len(listed) == 5
    decode = next(w for w in listed if w["id"] == workers["decode"].pk)
    assert FIELDS <= set(decode)
    assert decode["deployment"] == "demo" and decode["node"] == "local" and decode["revision"] == 1
    assert decode["dtype"] == "bfloat16"  # what the worker reported running (its revision asks for auto)
    assert decode["url"] == f"http://127.0.0.1:{workers['decode'].port}"
    gateway = next(w for w in listed if w["role"] == "gateway")
    assert gateway["revision"] is None


def test_the_list_filters_by_deployment_role_and_status(viewer_api, workers):
    assert ids(viewer_api.get("/api/v1/workers/?deployment=other")) == [workers["other"].pk]
    assert ids(viewer_api.get("/api/v1/workers/?deployment=demo&role=decode")) == [workers["decode"].pk,
                                                                                   workers["decode_failed"].pk]
    assert ids(viewer_api.get("/api/v1/workers/?role=decode&status=failed")) == [workers["decode_failed"].pk]
    assert ids(viewer_api.get("/api/v1/workers/?deployment=nope")) == []


def test_an_unknown_filter_value_is_400(viewer_api, workers):
    response = viewer_api.get("/api/v1/workers/?status=sleepy")
    assert response.status_code == 400
    assert "status" in response.json()["error"]["fields"]


def test_detail_and_404(viewer_api, workers):
    assert viewer_api.get(f"/api/v1/workers/{workers['decode'].pk}/").json()["role"] == "decode"
    assert viewer_api.get("/api/v1/workers/999999/").status_code == 404
    assert viewer_api.get(f"/api/v1/workers/{10**30}/").status_code == 404


def test_restart_records_a_pending_restart_action_for_the_worker(operator_api, workers):
    worker = workers["decode_failed"]
    response = operator_api.post(f"/api/v1/workers/{worker.pk}/restart", {"reason": "try again"}, format="json")
    assert response.status_code == 202, response.content
    action = response.json()["action"]
    assert (action["kind"], action["status"], action["worker"], action["deployment"]) == ("restart", "pending",
                                                                                        worker.pk, "demo")
    assert response.json()["worker"]["id"] == worker.pk


def test_a_second_restart_while_one_is_in_progress_is_409(operator_api, workers):
    url = f"/api/v1/workers/{workers['decode'].pk}/restart"
    assert operator_api.post(url, {}, format="json").status_code == 202
    response = operator_api.post(url, {}, format="json")
    assert response.status_code == 409
    assert "already has a restart in progress" in response.json()["error"]["message"]


def test_restarting_a_stopped_worker_is_409(operator_api, deployment, make_worker):
    worker = make_worker(deployment, "decode", status="stopped")
    response = operator_api.post(f"/api/v1/workers/{worker.pk}/restart", {}, format="json")
    assert response.status_code == 409
    assert "is stopped" in response.json()["error"]["message"]


def test_drain_records_a_pending_drain_action(operator_api, workers):
    response = operator_api.post(f"/api/v1/workers/{workers['prefill'].pk}/drain", {}, format="json")
    assert response.status_code == 202
    assert response.json()["action"]["kind"] == "drain"
    assert Action.objects.filter(kind="drain", worker=workers["prefill"]).count() == 1


def test_a_gateway_cannot_be_drained(operator_api, workers):
    response = operator_api.post(f"/api/v1/workers/{workers['gateway'].pk}/drain", {}, format="json")
    assert response.status_code == 400
    assert "gateway cannot be drained" in response.json()["error"]["message"]


def test_a_failed_worker_cannot_be_drained(operator_api, workers):
    response = operator_api.post(f"/api/v1/workers/{workers['decode_failed'].pk}/drain", {}, format="json")
    assert response.status_code == 409


def test_restart_of_an_unknown_worker_is_404(operator_api, workers):
    assert operator_api.post("/api/v1/workers/424242/restart", {}, format="json").status_code == 404
