"""The capacity API: viewers plan, operators apply (one audited scale per pool), admins profile; bad input is a 400
that names the field (and role), never a half-applied change."""
import pytest

from controlplane.capacity.models import PoolSchedule, Profile, ProfileJob
from controlplane.models import Action, Pool

PLAN = "/api/v1/capacity/plan"
APPLY = "/api/v1/capacity/plan/apply"


@pytest.fixture
def profiled(deployment):
    """Profiles of `demo`'s revision as a profile run would store them (curves of a small CPU model)."""
    revision = deployment.current_revision
    common = {"max_num_seqs": 32, "max_batch_tokens": 2048, "kv_capacity_tokens": 60_000, "kv_bytes_per_token": 4096}
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}},
                           points={"prefill": [{"prompt_tokens": 16, "batch": 1, "batch_tokens": 16,
                                                "latency_s": 0.013, "source": "synthetic"}]}, **common)
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 5e-4, "c": 1e-7},
                                                                   "kv_transfer": {"seconds_per_token": 1e-5}},
                           points={"decode": []}, **common)
    return deployment


def body(**changes):
    data = {"deployment": "demo", "traffic": {"requests_per_s": 5, "prompt_tokens_mean": 200, "output_tokens_mean": 50},
            "objectives": {"ttft_p99_s": 0.3, "itl_p99_s": 0.05}, "prices": {"prefill": 2, "decode": 1,
                                                                            "colocated": 1.5}}
    data.update(changes)
    return data


def test_a_viewer_gets_both_layouts_and_a_recommendation(profiled, viewer_api):
    response = viewer_api.post(PLAN, body(), format="json")
    assert response.status_code == 200, response.content
    plan = response.json()
    assert set(plan["layouts"]) == {"disaggregated", "colocated"}
    disaggregated = plan["layouts"]["disaggregated"]
    assert disaggregated["feasible"] and set(disaggregated["replicas"]) == {"prefill", "decode"}
    assert disaggregated["predicted"]["itl_p99_s"] <= 0.05
    assert plan["recommended"] in ("disaggregated", "colocated") and plan["current_replicas"] == {"prefill": 1,
                                                                                                 "decode": 1}


def test_what_if_traffic_times_two_asks_for_more_replicas(profiled, viewer_api):
    base = viewer_api.post(PLAN, body(), format="json").json()
    double = viewer_api.post(PLAN, body(what_if={"traffic": 4}), format="json").json()
    assert double["traffic"]["requests_per_s"] == 20
    assert sum(double["layouts"]["colocated"]["replicas"].values()) > \
        sum(base["layouts"]["colocated"]["replicas"].values())


@pytest.mark.parametrize("change, field", [
    ({"objectives": {"ttft_p99_s": 0.3}}, "objectives.itl_p99_s"),
    ({"traffic": {"requests_per_s": -1, "prompt_tokens_mean": 200, "output_tokens_mean": 50}},
     "traffic.requests_per_s"),
    ({"traffic": {"requests_per_s": 1, "prompt_tokens_mean": 200}}, "traffic.output_tokens_mean"),
    ({"what_if": {"traffic": 0}}, "what_if.traffic"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_plan_input_is_a_400_naming_the_field(profiled, viewer_api, change, field):
    response = viewer_api.post(PLAN, body(**change), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error.get("fields", {}) or error.get("field") == field, error


def test_a_plan_without_a_profile_says_how_to_make_one(deployment, viewer_api):
    response = viewer_api.post(PLAN, body(), format="json")
    assert response.status_code == 400 and "tandem_profile demo" in response.json()["error"]["message"]


def test_traffic_from_hours_without_any_traffic_is_a_400(profiled, viewer_api):
    response = viewer_api.post(PLAN, body(traffic={"hours": 6}), format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "traffic.hours"


def test_an_operator_applies_one_audited_scale_action_per_pool(profiled, operator_api, operator):
    response = operator_api.post(APPLY, {"deployment": "demo", "replicas": {"prefill": 2, "decode": 3}},
                                 format="json")
    assert response.status_code == 200, response.content
    assert {(a["role"], a["from"], a["to"]) for a in response.json()["actions"]} == {("prefill", 1, 2),
                                                                                     ("decode", 1, 3)}
    actions = Action.objects.filter(deployment=profiled, kind="scale")
    assert actions.count() == 2 and set(actions.values_list("actor", flat=True)) == {operator.username}
    assert dict(Pool.objects.filter(deployment=profiled).values_list("role", "desired_replicas")) == \
        {"prefill": 2, "decode": 3}


def test_a_viewer_may_not_apply(profiled, viewer_api):
    response = viewer_api.post(APPLY, {"deployment": "demo", "replicas": {"decode": 2}}, format="json")
    assert response.status_code == 403
    assert not Action.objects.filter(kind="scale").exists()


def test_applying_the_other_layouts_plan_changes_nothing_and_names_the_role(profiled, operator_api):
    response = operator_api.post(APPLY, {"deployment": "demo", "replicas": {"decode": 2, "colocated": 3}},
                                 format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == "replicas.colocated" and error["role"] == "colocated"
    assert "disaggregated" in error["message"]
    assert not Action.objects.filter(kind="scale").exists()
    assert Pool.objects.get(deployment=profiled, role="decode").desired_replicas == 1


def test_applying_beyond_a_pools_max_is_refused_before_any_pool_moves(profiled, operator_api):
    response = operator_api.post(APPLY, {"deployment": "demo", "replicas": {"decode": 2, "prefill": 99}},
                                 format="json")
    assert response.status_code == 400 and response.json()["error"]["role"] == "prefill"
    assert not Action.objects.filter(kind="scale").exists()


def test_profiling_is_for_admins_and_answers_a_job_to_poll(deployment, operator_api, admin_api, monkeypatch):
    from controlplane.capacity import tasks

    sent = []
    monkeypatch.setattr(tasks.profile_task, "apply_async", lambda args=(), **kw: sent.append(args))
    assert operator_api.post("/api/v1/deployments/demo/profiles", {"quick": True}, format="json") \
        .status_code == 403
    response = admin_api.post("/api/v1/deployments/demo/profiles", {"quick": True}, format="json")
    assert response.status_code == 202, response.content
    job = response.json()
    assert job["status"] == "pending" and job["quick"] is True
    assert admin_api.get(f"/api/v1/profile-jobs/{job['id']}").json()["status"] == "pending"
    assert admin_api.post("/api/v1/deployments/demo/profiles", {}, format="json").status_code == 409
    assert ProfileJob.objects.count() == 1


def test_profiling_next_to_serving_workers_on_this_host_is_refused_unless_allowed(deployment, admin_api,
                                                                                  make_worker, monkeypatch):
    from controlplane.capacity import tasks

    monkeypatch.setattr(tasks.profile_task, "apply_async", lambda *a, **kw: None)
    make_worker(deployment, "decode")  # a ready worker on the node "local"
    response = admin_api.post("/api/v1/deployments/demo/profiles", {}, format="json")
    assert response.status_code == 409 and "disturb production traffic" in response.json()["error"]["message"]
    assert admin_api.post("/api/v1/deployments/demo/profiles", {"allow_shared_host": True},
                          format="json").status_code == 202


def test_schedules_crud_for_operators_with_400s_naming_field_and_role(deployment, operator_api, viewer_api):
    url = "/api/v1/deployments/demo/schedules"
    new = {"role": "decode", "name": "business", "cron": "0 9 * * 1-5", "duration_minutes": 540,
           "timezone": "Europe/Paris", "min_replicas": 4}
    assert viewer_api.post(url, new, format="json").status_code == 403
    created = operator_api.post(url, new, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["next_start"] is not None
    bad = operator_api.post(url, {**new, "name": "x", "cron": "every day"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "cron"
    bad = operator_api.post(url, {**new, "name": "y", "role": "colocated"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "role"
    bad = operator_api.post(url, {**new, "name": "z", "timezone": "Paris"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "timezone"
    schedule_id = created.json()["id"]
    patched = operator_api.patch(f"{url}/{schedule_id}", {"max_replicas": 2}, format="json")
    assert patched.status_code == 400 and patched.json()["error"]["field"] == "min_replicas"  # 4 > 2
    assert operator_api.patch(f"{url}/{schedule_id}", {"min_replicas": 2}, format="json").status_code == 200
    listed = viewer_api.get(url).json()["schedules"]
    assert [(s["name"], s["min_replicas"]) for s in listed] == [("business", 2)]
    assert operator_api.delete(f"{url}/{schedule_id}").status_code == 204
    assert not PoolSchedule.objects.exists()


def test_predictive_settings_per_pool(deployment, operator_api, viewer_api):
    url = "/api/v1/deployments/demo/predictive"
    response = operator_api.put(url, {"role": "decode", "enabled": True, "lead_time_s": 600,
                                      "requests_per_replica": 2.5}, format="json")
    assert response.status_code == 200, response.content
    assert viewer_api.get(url).json()["pools"]["decode"]["enabled"] is True
    assert operator_api.put(url, {"role": "gateway", "enabled": True}, format="json").json()["error"]["field"] \
        == "role"
    assert viewer_api.put(url, {"role": "decode", "enabled": False}, format="json").status_code == 403
