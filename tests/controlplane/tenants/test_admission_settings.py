"""A deployment's admission settings (queue bound, per-class deadlines, preemption bounds): set through PATCH .../access, each bad value
a 400 naming its field, one audit row per change, carried by the endpoints answer its gateways poll (only when
set), and shown on the deployment page's serving settings."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

ACCESS = "/api/v1/deployments/demo/access"


def test_an_admin_sets_them_and_the_gateways_poll_them(admin_api, viewer_api, deployment):
    assert "admission" not in viewer_api.get("/api/v1/deployments/demo/endpoints").json()
    settings = {"max_queued": 64, "queue_deadlines": {"interactive": 2, "batch": 600}, "max_preemptions": 2}
    response = admin_api.patch(ACCESS, {"admission": settings}, format="json")
    assert response.status_code == 200
    expected = {"max_queued": 64, "queue_deadlines": {"interactive": 2.0, "batch": 600.0}, "max_preemptions": 2}
    assert response.json()["admission"] == expected
    assert response.json()["requires_key"] is False  # the other setting is untouched
    assert viewer_api.get("/api/v1/deployments/demo/endpoints").json()["admission"] == expected
    # With keys required too, the answer carries both.
    admin_api.patch(ACCESS, {"requires_key": True}, format="json")
    body = viewer_api.get("/api/v1/deployments/demo/endpoints").json()
    assert body["requires_key"] is True and body["admission"] == expected
    # null clears them: the gateways' flags apply again.
    assert admin_api.patch(ACCESS, {"admission": None}, format="json").json()["admission"] == {}
    assert "admission" not in viewer_api.get("/api/v1/deployments/demo/endpoints").json()
    verbs = [row.params for row in deployment.actions.filter(kind="tenant").order_by("id")]
    assert [p["verb"] for p in verbs] == ["admission", "access", "admission"]
    assert verbs[0]["admission"] == expected


@pytest.mark.parametrize(("admission", "field"), [
    ([], "admission"),
    ({"max_waiting": 1}, "admission.max_waiting"),
    ({"max_queued": -1}, "admission.max_queued"),
    ({"max_queued": "8"}, "admission.max_queued"),
    ({"queue_deadlines": {"premium": 5}}, "admission.queue_deadlines.premium"),
    ({"queue_deadlines": {"batch": 0}}, "admission.queue_deadlines.batch"),
    ({"queue_deadlines": "fast"}, "admission.queue_deadlines"),
    ({"max_preemptions": -1}, "admission.max_preemptions"),
    ({"preempt_margin": "wide"}, "admission.preempt_margin"),
    ({"preempt_min_tokens_left": 0.5}, "admission.preempt_min_tokens_left"),
])
def test_a_bad_value_is_a_400_naming_its_field(admin_api, deployment, admission, field):
    response = admin_api.patch(ACCESS, {"admission": admission}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_one_setting_per_patch(admin_api, deployment):
    both = admin_api.patch(ACCESS, {"requires_key": True, "admission": {}}, format="json")
    assert both.status_code == 400 and both.json()["error"]["field"] == "admission"
    assert admin_api.patch(ACCESS, {}, format="json").status_code == 400


def test_the_deployment_page_shows_them(admin_api, viewer, deployment):
    from django.test import Client

    client = Client()
    client.force_login(viewer)
    page = client.get("/deployments/demo/").content.decode()
    assert 'id="admission-settings"' in page and "gateway flags" in page
    admin_api.patch(ACCESS, {"admission": {"max_queued": 64, "queue_deadlines": {"batch": 600}}}, format="json")
    page = client.get("/deployments/demo/").content.decode()
    assert 'data-admission="max_queued"' in page and ">64<" in page
    assert 'data-admission="queue_deadlines.batch"' in page and "600 s" in page
