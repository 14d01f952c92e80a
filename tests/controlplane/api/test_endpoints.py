"""GET /api/v1/deployments/{name}/endpoints: the gateway membership of docs/contracts.md."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_only_ready_workers_are_listed_grouped_by_revision_newest_first(viewer_api, deployment, second_revision,
                                                                       make_worker):
    rev1 = deployment.revisions.get(number=1)
    old_prefill = make_worker(deployment, "prefill", revision=rev1, status="ready")
    old_decode = make_worker(deployment, "decode", revision=rev1, status="ready")
    new_prefill = make_worker(deployment, "prefill", revision=second_revision, status="ready")
    make_worker(deployment, "decode", revision=second_revision, status="starting")
    make_worker(deployment, "decode", revision=rev1, status="draining")
    make_worker(deployment, "decode", revision=rev1, status="failed")
    make_worker(deployment, "gateway", status="ready")

    body = viewer_api.get("/api/v1/deployments/demo/endpoints").json()
    assert body == {
        "deployment": "demo", "model": "demo", "mode": "disaggregated",
        "groups": [
            {"revision": 2, "prefill": [new_prefill.url], "decode": [], "colocated": [],
             "weights": {new_prefill.url: 1}},
            {"revision": 1, "prefill": [old_prefill.url], "decode": [old_decode.url], "colocated": [],
             "weights": {old_prefill.url: 1, old_decode.url: 1}},
        ],
        "sampling_defaults": {},
        "objectives": {"itl_p99_seconds": 1.0},  # the gateway sends it to the workers (batch_limit.py)
    }


def test_a_deployment_without_ready_workers_has_no_groups(viewer_api, deployment):
    assert viewer_api.get("/api/v1/deployments/demo/endpoints").json()["groups"] == []


def test_colocated_workers_are_listed_under_colocated(viewer_api, make_deployment, make_worker):
    chat = make_deployment("chat", mode="colocated")
    worker = make_worker(chat, "colocated", status="ready")
    body = viewer_api.get("/api/v1/deployments/chat/endpoints").json()
    assert body["mode"] == "colocated"
    assert body["groups"] == [{"revision": 1, "prefill": [], "decode": [], "colocated": [worker.url],
                               "weights": {worker.url: 1}}]


def test_an_unknown_deployment_is_404(viewer_api, deployment):
    assert viewer_api.get("/api/v1/deployments/nope/endpoints").status_code == 404


def test_the_membership_poll_reads_a_few_rows_whatever_the_pool_sizes(viewer_api, deployment, make_worker):
    """Every gateway polls this every 2 s: its queries stay few and flat as workers are added (the token, the
    role, the deployment row, its ready workers, its latest rollout), and none counts workers."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def poll():
        with CaptureQueriesContext(connection) as queries:
            assert viewer_api.get("/api/v1/deployments/demo/endpoints").status_code == 200
        return [q["sql"] for q in queries.captured_queries]

    make_worker(deployment, "decode", status="ready")
    few = poll()
    for _ in range(8):
        make_worker(deployment, "prefill", status="ready")
    many = poll()
    assert len(many) == len(few) <= 6
    assert not any("COUNT(" in sql.upper() for sql in many)
