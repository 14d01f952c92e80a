"""A bad rule gets a 400 whose message names the field."""
import pytest

BASE = {"name": "kv-full", "deployment": "demo", "role": "decode", "metric": "kv_cache_usage_ratio",
        "comparison": ">", "threshold": 0.9}


@pytest.mark.parametrize("change, field, words", [
    ({"metric": "kv_usage"}, "metric", "unknown metric 'kv_usage'"),
    ({"comparison": "=>"}, "comparison", "not a valid choice"),
    ({"for_s": -5}, "for_s", "greater than or equal to 0"),
    ({"keep_firing_for_s": -1}, "keep_firing_for_s", "greater than or equal to 0"),
    ({"actions": [{"type": "notify", "channels": ["pager"]}]}, "actions[0].channels", "unknown channel(s) pager"),
    ({"actions": [{"type": "restart"}]}, "actions[0].type", "per-worker"),
    ({"actions": [{"type": "reboot"}]}, "actions[0].type", "must be one of"),
    ({"actions": [{"type": "scale", "step": 0}]}, "actions[0].step", "integer from 1"),
    ({"role": "gateway", "actions": [{"type": "scale"}]}, "actions[0].type", "gateway has no pool"),
    ({"labels": {"deployment": "x"}}, "labels", "may not set"),
    ({"name": "no spaces allowed"}, "name", "letters"),
    ({"deployment": "nope"}, "deployment", "does not exist"),
])
def test_it_refuses_a_bad_rule_naming_the_field(quiet_deployment, admin_api, change, field, words):
    response = admin_api.post("/api/v1/alert-rules/", {**BASE, **change}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert words in error["message"]
    assert error.get("field") == field or field in error.get("fields", {})


def test_a_duplicate_name_is_a_conflict(quiet_deployment, admin_api):
    assert admin_api.post("/api/v1/alert-rules/", BASE, format="json").status_code == 201
    response = admin_api.post("/api/v1/alert-rules/", BASE, format="json")
    assert response.status_code == 409
    assert "already exists" in response.json()["error"]["message"]


def test_a_rule_naming_a_known_channel_is_accepted(quiet_deployment, admin_api):
    channel = admin_api.post("/api/v1/channels/", {"name": "pager", "kind": "slack",
                                                   "url": "https://hooks.example.com/x"}, format="json")
    assert channel.status_code == 201, channel.content
    body = {**BASE, "actions": [{"type": "notify", "channels": ["pager"]}]}
    response = admin_api.post("/api/v1/alert-rules/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["actions"] == [{"type": "notify", "channels": ["pager"]}]
