"""Bad input is a 4xx with a JSON message, never a 500: junk JSON, wrong types, negative and huge numbers, unknown
names, unknown fields (ignored)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db

WRITES = [
    "/api/v1/deployments/",
    "/api/v1/deployments/demo/revisions/",
    "/api/v1/deployments/demo/scale",
    "/api/v1/deployments/demo/rollback",
    "/api/v1/workers/{worker}/restart",
    "/api/v1/workers/{worker}/drain",
]
JUNK_BODIES = [
    b"{not json", b"[1, 2, 3]", b'"a string"', b"null", b"42", b'{"replicas": {"$gt": 1}}',
    json.dumps({"role": "decode", "replicas": "three"}).encode(),
    json.dumps({"role": "decode", "replicas": -5}).encode(),
    json.dumps({"role": "decode", "replicas": 10**40}).encode(),
    json.dumps({"role": ["decode"], "replicas": 1.5}).encode(),
    json.dumps({"revision": "latest", "reason": {"x": 1}}).encode(),
    json.dumps({"name": 12, "mode": "both", "model_path": ["/"], "engine_settings": [1],
                "replicas": {"decode": "x"}, "gateway_port": 80}).encode(),
    json.dumps({"name": "x" * 10_000, "mode": "colocated", "model_path": "/" + "a" * 5000}).encode(),
    json.dumps({"idempotency_key": "k" * 1000}).encode(),
    # PostgreSQL refuses NUL in text and \u0000 in jsonb: these must stop at validation.
    json.dumps({"name": "a\u0000b", "mode": "colocated", "model_path": "/tmp\u0000", "reason": "\u0000",
                "engine_settings": {"device": "cpu\u0000", "\u0000": 1}, "replicas": {"\u0000": 1}}).encode(),
    json.dumps({"role": "decode", "replicas": 2, "reason": "x\u0000y", "idempotency_key": "\u0000"}).encode(),
    json.dumps({"comment": "\u0000", "engine_settings": {"threads": 1, "\u0000": 2}}).encode(),
    b"\xff\xfe\x00garbage",
]


@pytest.fixture
def worker(deployment, make_worker):
    return make_worker(deployment, "decode")


# Bodies that are not a JSON object at all: refused by every write.
NOT_AN_OBJECT = {b"{not json", b"[1, 2, 3]", b'"a string"', b"null", b"42", b"\xff\xfe\x00garbage"}


@pytest.mark.parametrize("url", WRITES)
def test_junk_bodies_never_get_a_500(admin_api, worker, url):
    for body in JUNK_BODIES:
        response = admin_api.generic("POST", url.format(worker=worker.pk), body, content_type="application/json")
        # Some junk still makes a valid request (a revision copies every field not given; unknown fields are
        # ignored), so 202 is a fair answer; a 5xx never is.
        assert response.status_code < 500, (url, body, response.status_code, response.content[:300])
        if body in NOT_AN_OBJECT:
            assert response.status_code == 400, (url, body, response.status_code)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["code"]


def test_a_wrong_type_names_the_field(operator_api, deployment):
    response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": "three"},
                                 format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("replicas: ")
    assert list(error["fields"]) == ["replicas"]


def test_malformed_json_is_400_saying_so(operator_api, deployment):
    response = operator_api.generic("POST", "/api/v1/deployments/demo/scale", b"{oops",
                                    content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["error"]["message"]


def test_unknown_fields_are_refused_with_their_names(operator_api, deployment):
    # A misspelt or invented field is a client that believes it asked for something it did not get.
    response = operator_api.post("/api/v1/deployments/demo/scale",
                                 {"role": "decode", "replicas": 2, "colour": "blue"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"colour": [
        "unknown field; this request accepts acknowledge_prediction, idempotency_key, reason, replicas, role"]}


def test_an_unsupported_media_type_is_415(operator_api, deployment):
    response = operator_api.generic("POST", "/api/v1/deployments/demo/scale", b"role=decode",
                                    content_type="text/csv")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_a_wrong_method_is_405_in_the_same_shape(viewer_api, deployment):
    response = viewer_api.put("/api/v1/deployments/demo/", {}, format="json")
    assert response.status_code in (403, 405)
    response = viewer_api.get("/api/v1/deployments/demo/scale")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("url", [
    "/api/v1/deployments/%00/", "/api/v1/deployments/" + "x" * 3000 + "/", "/api/v1/nodes/nope/",
    "/api/v1/workers/0/", "/api/v1/workers/99999999999999999999999999/", "/api/v1/actions/0/",
    "/api/v1/actions/99999999999999999999999999/", "/api/v1/deployments/nope/revisions/",
    "/api/v1/workers/?deployment=" + "x" * 500, "/api/v1/actions/?worker=-1", "/api/v1/actions/?page=abc",
    "/api/v1/actions/?page_size=-3", "/api/v1/actions/?actor=a%00b", "/api/v1/workers/?deployment=%00",
    "/api/v1/workers/?node=%00", "/api/v1/nodes/%00/", "/api/v1/deployments/%00/endpoints",
])
def test_unknown_names_and_ids_are_4xx_never_500(viewer_api, deployment, url):
    response = viewer_api.get(url)
    assert 400 <= response.status_code < 500 or response.status_code == 200, response.content[:300]
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


def test_a_row_deleted_between_lookup_and_lock_is_404_not_500(operator_api, deployment, monkeypatch):
    # A concurrent delete between the view's look-up and the service's row lock, made deterministic.
    from controlplane.api.views import operations

    real_get = operations.deployment_get

    def get_then_vanish(name):
        found = real_get(name)
        type(found).objects.filter(pk=found.pk).delete()
        return found

    monkeypatch.setattr(operations, "deployment_get", get_then_vanish)
    response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "the deployment no longer exists (it was deleted meanwhile)"


@pytest.mark.parametrize("url, body, where", [
    ("/api/v1/alert-rules/", {"name": "r", "metric": "qps", "comparison": ">", "threshold": 1,
                              "labels": {"team": "a\u0000"}}, "labels.team"),
    ("/api/v1/alert-rules/", {"name": "r", "metric": "qps", "comparison": ">", "threshold": 1,
                              "annotations": {"\u0000": "x"}}, "annotations.\u0000"),
    ("/api/v1/silences/", {"matchers": [{"name": "deployment", "value": "\u0000"}],
                           "ends_at": "2099-01-01T00:00:00Z", "comment": "c"}, "matchers[0].value"),
    ("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2, "params": ["\u0000"]}, "params[0]"),
])
def test_a_nul_anywhere_in_a_json_body_is_400_naming_where_as_postgresql_stores_none(admin_api, deployment, url,
                                                                                   body, where):
    from controlplane.alerting.models import AlertRule, Silence
    from controlplane.models import Action

    num_rules, num_actions = AlertRule.objects.count(), Action.objects.count()
    response = admin_api.post(url, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "parse_error" and error["message"].startswith(f"{where} contains a NUL"), error
    assert (AlertRule.objects.count(), Action.objects.count(), Silence.objects.count()) == (num_rules, num_actions, 0)


def test_a_form_body_whose_json_field_decodes_to_a_nul_is_400(admin_api, deployment):
    # A JSONField reads a form value as JSON text: the six characters \u0000 would become a NUL there.
    response = admin_api.post("/api/v1/alert-rules/", {"name": "r", "metric": "qps", "comparison": ">",
                                                       "threshold": "1", "labels": '{"team": "a\\u0000"}'})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith("labels contains a NUL")


def test_an_idempotency_key_header_with_a_control_character_is_400(operator_api, deployment):
    from controlplane.models import Action

    response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json",
                                 HTTP_IDEMPOTENCY_KEY="a\x00b")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "idempotency_key"
    assert not Action.objects.filter(kind="scale").exists()
