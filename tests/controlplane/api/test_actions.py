"""GET /api/v1/actions/: the audit log, newest first, filtered, paginated, read-only."""
from __future__ import annotations

import pytest

from controlplane.services import Actor, pool_scale

pytestmark = pytest.mark.django_db


@pytest.fixture
def log(deployment, operator):
    pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator, reason="by hand")
    pool_scale(deployment=deployment, role="decode", replicas=3, actor=Actor.rule("p99-latency"), reason="p99 0.8s")
    pool_scale(deployment=deployment, role="prefill", replicas=2, actor=Actor.autoscaler(), reason="ttft")


def results(response):
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_it_lists_newest_first(viewer_api, log):
    actions = results(viewer_api.get("/api/v1/actions/"))
    assert [(a["kind"], a["actor"]) for a in actions] == [("scale", "autoscaler"), ("scale", "p99-latency"),
                                                          ("scale", "otto-operator"), ("create", "ada-admin")]


def test_it_filters_by_actor_actor_type_kind_and_deployment(viewer_api, log, make_deployment):
    make_deployment("other", mode="colocated")
    assert [a["reason"] for a in results(viewer_api.get("/api/v1/actions/?actor=otto-operator"))] == ["by hand"]
    assert [a["actor"] for a in results(viewer_api.get("/api/v1/actions/?actor_type=rule"))] == ["p99-latency"]
    assert len(results(viewer_api.get("/api/v1/actions/?kind=scale&deployment=demo"))) == 3
    assert [a["deployment"] for a in results(viewer_api.get("/api/v1/actions/?deployment=other"))] == ["other"]


def test_it_paginates(viewer_api, log):
    page = viewer_api.get("/api/v1/actions/?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]
    assert len(viewer_api.get("/api/v1/actions/?page_size=2&page=2").json()["results"]) == 2
    assert viewer_api.get("/api/v1/actions/?page=99").status_code == 404


def test_a_bad_filter_is_400(viewer_api, log):
    response = viewer_api.get("/api/v1/actions/?kind=explode")
    assert response.status_code == 400
    assert "kind" in response.json()["error"]["fields"]


def test_detail_and_404(viewer_api, log):
    first = results(viewer_api.get("/api/v1/actions/"))[0]
    assert viewer_api.get(f"/api/v1/actions/{first['id']}/").json() == first
    assert viewer_api.get("/api/v1/actions/987654/").status_code == 404


def test_it_is_read_only(admin_api, log):
    assert admin_api.post("/api/v1/actions/", {"kind": "scale"}, format="json").status_code == 405
    first = results(admin_api.get("/api/v1/actions/"))[0]
    assert admin_api.delete(f"/api/v1/actions/{first['id']}/").status_code == 405


def test_the_log_outlives_a_deleted_deployment(viewer_api, log, deployment):
    deployment.delete()  # what reconcile does at the end of a delete
    actions = results(viewer_api.get("/api/v1/actions/?deployment=demo"))
    assert len(actions) == 4 and all(a["deployment"] == "demo" for a in actions)
