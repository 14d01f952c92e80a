"""GET/PUT /api/v1/deployments/{name}/autoscaling: the settings, the manual-scale pause and its resume."""
import pytest

from controlplane.models import Deployment

URL = "/api/v1/deployments/demo/autoscaling"


def test_a_viewer_sees_the_rule_and_each_pools_defaults(viewer_api, deployment):
    body = viewer_api.get(URL).json()
    assert body["enabled"] is False and "pauses that pool's autoscaler" in body["rule"]
    assert body["pools"]["prefill"]["metric"] == "ttft_p99_seconds" and body["pools"]["prefill"]["target"] == 1.0
    assert body["pools"]["decode"]["metric"] == "itl_p99_seconds" and body["pools"]["decode"]["target"] == 0.1
    assert body["pools"]["decode"]["paused_until"] is None
    assert (body["tolerance"], body["scale_down_stabilization_s"]) == (0.1, 300)


def test_an_operator_turns_it_on_and_changes_a_pool_policy(operator_api, deployment):
    response = operator_api.put(URL, {"enabled": True, "pools": {"decode": {
        "metric": "requests_running_per_worker", "target": 8}}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["pools"]["decode"]["metric"] == "requests_running_per_worker"
    assert Deployment.objects.get(name="demo").autoscale_enabled


def test_an_operator_sets_and_clears_the_queue_wait_target_of_the_decode_pool(operator_api, deployment):
    assert operator_api.get(URL).json()["pools"]["decode"]["queue_wait_target"] is None  # off by default
    body = operator_api.put(URL, {"pools": {"decode": {"queue_wait_target": 0.5}}}, format="json").json()
    assert body["pools"]["decode"]["queue_wait_target"] == 0.5
    body = operator_api.put(URL, {"pools": {"decode": {"queue_wait_target": None}}}, format="json").json()
    assert body["pools"]["decode"]["queue_wait_target"] is None


def test_a_refused_queue_wait_target_changes_nothing(operator_api, deployment):
    response = operator_api.put(URL, {"enabled": True, "pools": {"decode": {"queue_wait_target": 0.5},
                                                                 "prefill": {"queue_wait_target": 0.5}}},
                                format="json")
    assert response.status_code == 400, response.content
    body = operator_api.get(URL).json()
    assert body["enabled"] is False and body["pools"]["decode"]["queue_wait_target"] is None


def test_a_manual_scale_shows_as_a_pause_until_resumed(operator_api, deployment):
    scale = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json")
    assert scale.status_code in (200, 202), scale.content
    paused = operator_api.get(URL).json()["pools"]["decode"]
    assert paused["paused_until"] is not None and paused["paused_by_action"] == scale.json()["action"]["id"]
    assert operator_api.get(URL).json()["pools"]["prefill"]["paused_until"] is None
    resumed = operator_api.put(URL, {"pools": {"decode": {"resume": True}}}, format="json").json()
    assert resumed["pools"]["decode"]["paused_until"] is None


def test_viewers_cannot_change_it(viewer_api, deployment):
    assert viewer_api.put(URL, {"enabled": True}, format="json").status_code == 403


@pytest.mark.parametrize("body, words", [
    ({"pools": {"colocated": {"enabled": True}}}, "has no pool colocated"),
    ({"pools": {"decode": {"metric": "vibes"}}}, "pools.decode.metric"),
    ({"pools": {"decode": {"target": 0}}}, "pools.decode.target"),
    ({"enabled": "maybe"}, "enabled"),
    ({"pools": {"decode": {"queue_wait_target": 0}}}, "pools.decode.queue_wait_target"),
    ({"pools": {"decode": {"queue_wait_target": "nan"}}}, "pools.decode.queue_wait_target"),
    ({"pools": {"decode": {"queue_wait_target": 7200}}}, "pools.decode.queue_wait_target"),
    ({"pools": {"decode": {"queue_wait_target": "soon"}}}, "pools.decode.queue_wait_target"),
    ({"pools": {"prefill": {"queue_wait_target": 0.5}}},
     "pools.prefill.queue_wait_target: the prefill pool does not bound the gateway's admission queue"),
])
def test_bad_input_answers_400_saying_what_is_wrong(operator_api, deployment, body, words):
    response = operator_api.put(URL, body, format="json")
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]["message"]


def test_an_unknown_deployment_is_404(viewer_api, db):
    assert viewer_api.get("/api/v1/deployments/nope/autoscaling").status_code == 404


def test_a_name_with_a_nul_or_too_long_to_be_a_deployment_is_404_without_a_query(viewer_api, operator_api, db):
    # PostgreSQL refuses a NUL in a text parameter: the look-up must not reach the database (SQLite would answer).
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for name in ("a%00b", "x" * 64):
        with CaptureQueriesContext(connection) as queries:
            assert viewer_api.get(f"/api/v1/deployments/{name}/autoscaling").status_code == 404
            assert operator_api.put(f"/api/v1/deployments/{name}/autoscaling", {}, format="json").status_code == 404
        assert not [q["sql"] for q in queries.captured_queries if "controlplane_deployment" in q["sql"]], name
