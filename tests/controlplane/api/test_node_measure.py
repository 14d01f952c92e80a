"""POST /api/v1/nodes/<name>/measure asks the node's agent to measure its host again (a message on its queue); the
node's figures are on GET /api/v1/nodes/<name>/."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def measure_messages(monkeypatch):
    from controlplane.agent import tasks

    messages = []
    monkeypatch.setattr(tasks.agent_measure_host, "apply_async",
                        lambda args=(), queue=None, **options: messages.append((tuple(args), queue)))
    return messages


def test_an_operator_asks_the_nodes_agent_to_measure(operator_api, node, measure_messages):
    r = operator_api.post("/api/v1/nodes/local/measure")
    assert r.status_code == 202
    assert r.json() == {"node": "local", "queued": True, "measured_at": None}
    assert measure_messages == [(("local",), "node.local")]


def test_the_answer_says_when_the_figures_it_holds_were_taken(operator_api, node, measure_messages):
    node.roofline = {"source": "measured", "measured_at": "2026-12-01T20:00:00+00:00",
                     "one_thread": {"threads": 1, "matmul_gflops": {"float32": 57.9}, "read_gbs": 12.0}}
    node.save(update_fields=["roofline"])
    assert operator_api.post("/api/v1/nodes/local/measure/").json()["measured_at"] == "2026-12-01T20:00:00+00:00"
    detail = operator_api.get("/api/v1/nodes/local/").json()
    assert detail["roofline"]["one_thread"]["matmul_gflops"] == {"float32": 57.9}


def test_a_viewer_may_not_and_an_unknown_node_is_a_404(viewer_api, operator_api, node, measure_messages):
    assert viewer_api.post("/api/v1/nodes/local/measure").status_code == 403
    assert operator_api.post("/api/v1/nodes/nowhere/measure").status_code == 404
    assert measure_messages == []


def test_the_roofline_is_not_writable_through_the_api(admin_api, node):
    r = admin_api.patch("/api/v1/nodes/local/", {"labels": {}, "roofline": {"one_thread": {}}}, format="json")
    assert r.status_code == 400 and "roofline" in r.json()["error"]["message"] + str(r.json())
    node.refresh_from_db()
    assert node.roofline == {}
