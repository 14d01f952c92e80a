"""Who may do what: viewers read rules and alerts, operators also manage silences, admins write rules and manage
channels and deliveries; anonymous callers get 401."""
import pytest

RULE = {"name": "kv-full", "deployment": "demo", "role": "decode", "metric": "kv_cache_usage_ratio",
        "comparison": ">", "threshold": 0.9}


@pytest.mark.parametrize("client, expected", [("anon_api", 401), ("outsider_api", 403), ("viewer_api", 403),
                                              ("operator_api", 403), ("admin_api", 201)])
def test_only_admins_create_rules(request, quiet_deployment, client, expected):
    response = request.getfixturevalue(client).post("/api/v1/alert-rules/", RULE, format="json")
    assert response.status_code == expected, response.content


@pytest.mark.parametrize("path", ["/api/v1/alert-rules/", "/api/v1/alerts/", "/api/v1/silences/",
                                  "/api/v1/alert-rules/export?format=prometheus"])
def test_viewers_read_rules_alerts_silences_and_the_export(deployment, viewer_api, anon_api, path):
    assert viewer_api.get(path).status_code == 200
    assert anon_api.get(path).status_code == 401


@pytest.mark.parametrize("path", ["/api/v1/channels/", "/api/v1/deliveries/"])
def test_channels_and_deliveries_are_for_admins_only(viewer_api, operator_api, admin_api, path):
    assert viewer_api.get(path).status_code == 403
    assert operator_api.get(path).status_code == 403
    assert admin_api.get(path).status_code == 200


def test_operators_create_and_expire_silences_and_viewers_cannot(viewer_api, operator_api):
    body = {"matchers": [{"name": "deployment", "value": "demo"}], "ends_at": "2099-01-01T00:00:00Z",
            "comment": "upgrade"}
    assert viewer_api.post("/api/v1/silences/", body, format="json").status_code == 403
    created = operator_api.post("/api/v1/silences/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["active"] is True and created.json()["created_by"] == "otto-operator"
    silence_id = created.json()["id"]
    assert viewer_api.delete(f"/api/v1/silences/{silence_id}/").status_code == 403
    expired = operator_api.delete(f"/api/v1/silences/{silence_id}/")
    assert expired.status_code == 200 and expired.json()["active"] is False


def test_an_admin_updates_and_deletes_a_rule(quiet_deployment, admin_api, viewer_api):
    created = admin_api.post("/api/v1/alert-rules/", RULE, format="json").json()
    path = f"/api/v1/alert-rules/{created['id']}/"
    assert viewer_api.patch(path, {"enabled": False}, format="json").status_code == 403
    changed = admin_api.patch(path, {"enabled": False}, format="json")
    assert changed.status_code == 200 and changed.json()["enabled"] is False
    assert admin_api.delete(path).status_code == 204
    assert viewer_api.get(path).status_code == 404


def test_alerts_filter_by_state_and_deployment(quiet_deployment, make_rule, write_sample, evaluate, at, viewer_api):
    make_rule(quiet_deployment)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    firing = viewer_api.get("/api/v1/alerts/?state=firing&deployment=demo").json()
    assert [a["state"] for a in firing["results"]] == ["firing"]
    assert viewer_api.get("/api/v1/alerts/?state=resolved").json()["results"] == []
    assert viewer_api.get("/api/v1/alerts/?deployment=other").json()["results"] == []
    detail = viewer_api.get(f"/api/v1/alerts/{firing['results'][0]['id']}/").json()
    assert detail["transitions"][0]["to_state"] == "firing"
    assert viewer_api.get("/api/v1/alerts/?state=sleeping").status_code == 400
