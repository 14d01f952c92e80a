"""Templates through the REST API, as an operator's script uses them: viewers list them, admins create an experiment
from one (its faults, hypothesis and abort condition; the name, role, count and duration given), a bad field is a
400 naming it, an operator is refused."""
from __future__ import annotations

import pytest

from controlplane.chaos.library import TEMPLATES

BASE = "/api/v1/deployments/demo/chaos"


@pytest.mark.django_db
def test_viewers_list_the_built_in_templates(viewer_api, deployment):
    response = viewer_api.get(f"{BASE}/templates")
    assert response.status_code == 200, response.content
    assert [t["key"] for t in response.json()] == [t.key for t in TEMPLATES]
    assert response.json()[0].keys() == {"key", "title", "description", "role", "faults", "duration_s"}


@pytest.mark.django_db
def test_an_admin_creates_an_experiment_from_a_template(admin_api, deployment):
    response = admin_api.post(f"{BASE}/templates/decode-kill", {"name": "kill-2", "count": 2, "duration_s": 5},
                              format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "kill-2" and body["target"] == {"role": "decode", "count": 2}
    assert body["faults"] == [{"kind": "kill"}] and body["duration_s"] == 5
    assert {"metric": "ready_workers", "role": "decode", "min": 1.0} in body["hypothesis"]
    # The deployment's failures, not its callers' 4xx (a missing key must not block the run).
    assert [check["metric"] for check in body["hypothesis"]][0] == "server_error_ratio"
    assert [c["metric"] for c in body["abort_conditions"]] == ["server_error_ratio"]
    assert admin_api.get(f"{BASE}/experiments/kill-2").status_code == 200
    # The name defaults to the template's key.
    assert admin_api.post(f"{BASE}/templates/prefill-kill", {}, format="json").json()["name"] == "prefill-kill"


@pytest.mark.django_db
@pytest.mark.parametrize("key,body,field", [
    ("no-such", {}, "template"),
    ("decode-kill", {"role": "colocated"}, "target.role"),
    ("decode-kill", {"duration_s": -1}, "duration_s"),
    ("decode-kill", {"colour": "red"}, "colour"),
])
def test_bad_input_is_a_400_naming_the_field(admin_api, deployment, key, body, field):
    response = admin_api.post(f"{BASE}/templates/{key}", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error.get("field") == field or field in error.get("fields", {}), error


@pytest.mark.django_db
def test_an_operator_may_not_create_one(operator_api, deployment):
    assert operator_api.post(f"{BASE}/templates/decode-kill", {}, format="json").status_code == 403
