"""The chaos API: every endpoint × every role (anonymous 401; a role below the one needed 403 naming it; admins
create, edit, delete and opt in, operators start and abort, viewers read), 400 naming the field, 403 for a
deployment that has not opted in, 409 for a second run or outside steady state."""
from __future__ import annotations

import time

import pytest

from tests.controlplane.chaos.test_driver import steady_history

BASE = "/api/v1/deployments/demo/chaos"
ANON, OUTSIDER, VIEWER, OPERATOR, ADMIN = "anonymous", "outsider", "viewer", "operator", "admin"
RANK = {OUTSIDER: 0, VIEWER: 1, OPERATOR: 2, ADMIN: 3}
NEW = {"name": "kill-decode", "target": {"role": "decode"}, "faults": [{"kind": "kill"}], "duration_s": 10,
       "hypothesis": [{"metric": "ready_workers", "role": "decode", "min": 1}]}

# (method, url, body, role needed, status when allowed)
ENDPOINTS = [
    ("get", BASE, None, VIEWER, 200),
    ("put", BASE, {"enabled": True}, ADMIN, 200),
    ("get", f"{BASE}/experiments", None, VIEWER, 200),
    ("post", f"{BASE}/experiments", NEW, ADMIN, 201),
    ("get", f"{BASE}/experiments/pause-decode", None, VIEWER, 200),
    ("patch", f"{BASE}/experiments/pause-decode", {"duration_s": 4}, ADMIN, 200),
    ("delete", f"{BASE}/experiments/pause-decode", None, ADMIN, 204),
    ("post", f"{BASE}/experiments/pause-decode/run", {}, OPERATOR, 201),
    ("get", f"{BASE}/runs", None, VIEWER, 200),
    ("get", f"{BASE}/runs/{{run}}", None, VIEWER, 200),
    ("get", f"{BASE}/runs/{{run}}/report", None, VIEWER, 200),
    ("post", f"{BASE}/runs/{{run}}/abort", {}, OPERATOR, 202),
    ("get", f"{BASE}/experiments/pause-decode/steady-state", None, VIEWER, 200),
    ("get", f"{BASE}/experiments/pause-decode/chaostoolkit.json", None, VIEWER, 200),
    ("get", f"{BASE}/templates", None, VIEWER, 200),
    ("post", f"{BASE}/templates/agent-kill", {"name": "from-template"}, ADMIN, 201),
    ("get", f"{BASE}/schedules", None, VIEWER, 200),
    ("post", f"{BASE}/schedules", {"experiment": "pause-decode", "cron": "0 10 * * 2"}, ADMIN, 201),
]


@pytest.fixture
def finished_run(experiment, world, gateway, operator, agent_inline, django_capture_on_commit_callbacks):
    """A run that an operator aborted and stopped waiting for: finished, so that a new one may start; its id."""
    from controlplane.chaos.services import run_abort, run_start

    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
        run_abort(run=run, actor=operator)
        run_abort(run=run, actor=operator)
    return run.pk


@pytest.mark.django_db
@pytest.mark.parametrize("method,url,body,needed,ok_status", ENDPOINTS, ids=[f"{m} {u}" for m, u, *_ in ENDPOINTS])
@pytest.mark.parametrize("who", [ANON, OUTSIDER, VIEWER, OPERATOR, ADMIN])
def test_each_role_gets_what_its_role_allows(who, method, url, body, needed, ok_status, api_for, request,
                                             finished_run):
    from controlplane.chaos.models import ChaosRun

    if url.endswith("/abort"):
        # An active run to abort: start one again on the steady history.
        from controlplane.chaos.models import Experiment
        from controlplane.chaos.services import run_start

        run = run_start(experiment=Experiment.objects.get(name="pause-decode"), actor=request.getfixturevalue(
            "operator"))
        url = url.format(run=run.pk)
    url = url.format(run=finished_run)
    user = None if who == ANON else request.getfixturevalue(who)
    client = api_for(user)
    response = getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)
    if who == ANON:
        assert response.status_code == 401, response.content
    elif RANK[who] < RANK[needed]:
        assert response.status_code == 403, response.content
        assert f"the {needed} role" in response.json()["error"]["message"]
    else:
        assert response.status_code == ok_status, response.content
    assert ChaosRun.objects.filter(pk=finished_run).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("change,field,words", [
    ({"faults": [{"kind": "cpu-hog"}]}, "faults[0].kind", "is not a fault this version carries out"),
    ({"faults": [{"kind": "latency"}]}, "faults[0].ms", "is required for a latency fault"),
    ({"faults": [{"kind": "latency", "ms": 100, "line_ms": 20_000}]}, "faults[0].line_ms", "in 0..10000"),
    ({"faults": [{"kind": "error", "ratio": 2}]}, "faults[0].ratio", "in 0.01..1"),
    ({"faults": [{"kind": "error", "ms": 5}]}, "faults[0].ms", "is not a field here"),
    ({"faults": [{"kind": "error"}, {"kind": "reset", "ratio": 0.1}]}, "faults[1].kind", "not several"),
    ({"faults": [{"kind": "kill", "duration_s": 5}]}, "faults[0].duration_s", "is not a field here"),
    ({"target": {"role": "decode", "revision": 0}}, "target.revision", "must be an integer"),
    ({"target": {"role": "colocated"}}, "target.role", "is not a role of this deployment"),
    ({"duration_s": 100_000}, "duration_s", "must be a number in 1..600"),
    ({"hypothesis": [{"metric": "p99", "max": 1}]}, "hypothesis[0].metric", "is unknown"),
    ({"hypothesis": [{"metric": "error_ratio"}]}, "hypothesis[0].max", "needs exactly one of"),
    ({"abort_conditions": [{"metric": "error_ratio", "above": 0.05, "for_s": -1}]}, "abort_conditions[0].for_s",
     "must be a number"),
    ({"faults": [{"kind": "pause", "duration_s": 20}]}, "faults[0].duration_s", "in 1..10"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_bad_input_is_a_400_naming_the_field(admin_api, world, change, field, words):
    response = admin_api.post(f"{BASE}/experiments", {**NEW, **change}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error.get("field") == field or field in error.get("fields", {}), error
    assert words in error["message"]


@pytest.mark.django_db
def test_a_run_on_a_deployment_that_has_not_opted_in_is_403(admin_api, operator_api, experiment):
    assert admin_api.put(BASE, {"enabled": False}, format="json").status_code == 200
    response = operator_api.post(f"{BASE}/experiments/pause-decode/run", {}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "chaos_disabled"


@pytest.mark.django_db
def test_a_run_outside_steady_state_is_409_with_why(operator_api, experiment, gateway):
    response = operator_api.post(f"{BASE}/experiments/pause-decode/run", {}, format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "not_steady" and "error_ratio: no data in the window" in error["failing"]


@pytest.mark.django_db
def test_a_second_concurrent_run_is_409(operator_api, experiment, gateway):
    steady_history(gateway, time.time())
    assert operator_api.post(f"{BASE}/experiments/pause-decode/run", {}, format="json").status_code == 201
    second = operator_api.post(f"{BASE}/experiments/pause-decode/run", {}, format="json")
    assert second.status_code == 409 and "one at a time" in second.json()["error"]["message"]
    assert operator_api.get(BASE).json()["active_run"] is not None


@pytest.mark.django_db
def test_the_opt_in_is_off_by_default_and_audited(admin_api, viewer_api, deployment):
    from controlplane.models import Action

    assert viewer_api.get(BASE).json()["enabled"] is False
    response = admin_api.put(BASE, {"enabled": True, "reason": "game day"}, format="json")
    assert response.status_code == 200 and response.json()["enabled"] is True
    action = Action.objects.get(pk=response.json()["action"]["id"])
    assert action.params == {"event": "chaos_enabled"} and action.reason == "game day"
    bad = admin_api.put(BASE, {"enabled": "yes"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "enabled"
