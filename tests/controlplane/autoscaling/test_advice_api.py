"""The mode and budget in GET/PUT /api/v1/deployments/{name}/autoscaling, and the advice list."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from tests.controlplane.autoscaling.support import observe, pool_of

URL = "/api/v1/deployments/demo/autoscaling"


def test_it_is_active_without_a_budget_until_an_operator_says_otherwise(operator_api, deployment):
    body = operator_api.get(URL).json()
    assert (body["mode"], body["max_workers"], body["num_workers"]) == ("active", None, 2)
    assert body["pools"]["decode"]["advice"] is None
    response = operator_api.put(URL, {"mode": "advisory", "max_workers": 6}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["mode"], response.json()["max_workers"]) == ("advisory", 6)
    assert operator_api.put(URL, {"max_workers": None}, format="json").json()["max_workers"] is None


@pytest.mark.parametrize("body, words", [
    ({"mode": "yolo"}, "mode"),
    ({"mode": None}, "mode"),
    ({"max_workers": 0}, "max_workers"),
    ({"max_workers": "lots"}, "max_workers"),
    ({"max_workers": 1}, "max_workers 1 is below the pools' min_replicas in all (2)"),
])
def test_a_bad_mode_or_budget_is_a_400_naming_the_field(operator_api, deployment, body, words):
    response = operator_api.put(URL, body, format="json")
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]["message"]
    assert operator_api.get(URL).json()["mode"] == "active"


def test_a_viewer_lists_the_advice_newest_first_and_sees_the_open_one_per_pool(scaled, operator_api, viewer_api):
    operator_api.put(URL, {"mode": "advisory"}, format="json")
    observe(scaled, "itl_p99_seconds", 0.3)
    autoscale_pool(pool_of(scaled), now=time.time())
    [row] = viewer_api.get(f"{URL}/advice").json()
    assert (row["role"], row["status"], row["from_replicas"], row["to_replicas"]) == ("decode", "open", 1, 3)
    assert row["ratio"] == pytest.approx(3.0) and row["inputs"]["num_ready"] == 1
    assert viewer_api.get(URL).json()["pools"]["decode"]["advice"]["id"] == row["id"]
    assert viewer_api.get(f"{URL}/advice?role=prefill").json() == []
    assert viewer_api.get(f"{URL}/advice?status=applied").json() == []
    assert viewer_api.get(f"{URL}/advice?status=maybe").status_code == 400
