"""What-if through the API: a recorded-format trace replayed on the deployment as it stands and as changed, side by
side; halving the decode pool under the trace's peak shows as lost attainment, a harmless change as none; a bad
change is a 400 naming its field, and nothing is replayed without the revision's profile."""
from __future__ import annotations

import json

import pytest

from controlplane.capacity.models import Profile
from controlplane.models import Deployment, Pool

URL = "/api/v1/deployments/demo/what-if"


@pytest.fixture
def fleet(deployment, operator_api):
    """`demo` with 1 prefill + 2 decode, profiled, objectives of 2 s TTFT and 0.1 s ITL, and a trace of a minute
    at 20 requests/s that two decode workers carry and one cannot."""
    revision = deployment.current_revision
    common = {"max_num_seqs": 32, "max_batch_tokens": 2048, "kv_capacity_tokens": 200_000, "kv_bytes_per_token": 4096}
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}},
                           **common)
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 5e-4, "c": 1e-7},
                                                                   "kv_transfer": {"seconds_per_token": 1e-5}},
                           **common)
    Pool.objects.filter(deployment=deployment, role="decode").update(desired_replicas=2)
    Deployment.objects.filter(pk=deployment.pk).update(objectives={"ttft_p99_seconds": 2.0, "itl_p99_seconds": 0.1,
                                                                   "e2e_p99_seconds": 60.0})
    lines = [json.dumps({"at_s": i / 20, "prompt_tokens": 50, "completion_tokens": 100, "tenant": f"t{i % 3}",
                         "class": "standard", "outcome": "ok"}) for i in range(1200)]
    answer = operator_api.post("/api/v1/deployments/demo/traces/import?format=tandem&name=peak",
                               data="\n".join(lines), content_type="text/plain")
    assert answer.status_code == 201, answer.content
    return deployment


def test_halving_the_decode_pool_under_the_peak_loses_attainment(fleet, viewer_api):
    answer = viewer_api.post(URL, {"trace": "peak", "change": {"pools": {"decode": {"replicas": 1}}}}, format="json")
    assert answer.status_code == 200, answer.content
    report = answer.json()
    assert report["trace"]["requests"] == 1200 and report["fleet"]["after"]["replicas"]["decode"] == 1
    assert report["before"]["offered"] == report["after"]["offered"] == 1200
    assert report["verdict"]["attainment_before"] >= 0.99 and report["verdict"]["meets_objective"] is False
    assert report["verdict"]["worse"] is True
    assert report["after"]["ttft_s"]["p99"] > 2.0 > report["before"]["ttft_s"]["p99"]
    assert report["before"]["worker_hours"]["total"] > report["after"]["worker_hours"]["total"]


def test_a_harmless_change_keeps_attainment_and_a_window_narrows_the_replay(fleet, viewer_api):
    answer = viewer_api.post(URL, {"trace": "peak", "since": 10, "until": 40,
                                   "change": {"admission": {"max_queued": 4096}}}, format="json")
    assert answer.status_code == 200, answer.content
    report = answer.json()
    assert report["trace"]["requests"] == 600
    assert report["verdict"]["attainment_after"] == report["verdict"]["attainment_before"] >= 0.99
    assert report["verdict"]["meets_objective"] and not report["verdict"]["worse"]


@pytest.mark.parametrize("change,field", [
    ({"pools": {"prefill": {"replicas": 0}}}, "change.pools.prefill.replicas"),
    ({"pools": {"decode": {"replicas": 9}}}, "change.pools.decode"),
    ({"pools": {"colocated": {"replicas": 1}}}, "change.pools.colocated"),
    ({"autoscaling": {"pools": {"decode": {"metric": "vibes", "target": 1}}}}, "change.autoscaling.pools.decode.metric"),
    ({"traffic": {"rate": -1}}, "change.traffic.rate"),
    ({"colour": "red"}, "change.colour"),
])
def test_a_bad_change_is_a_400_naming_its_field(fleet, viewer_api, change, field):
    answer = viewer_api.post(URL, {"trace": "peak", "change": change}, format="json")
    assert answer.status_code == 400 and answer.json()["error"]["field"] == field, answer.content


def test_no_profile_no_trace_no_window(deployment, viewer_api, operator_api):
    assert viewer_api.post(URL, {"trace": "nope"}, format="json").status_code == 404
    empty = viewer_api.post(URL, {"trace": "recorded"}, format="json")
    assert empty.status_code == 400 and "holds no request" in empty.json()["error"]["message"]
    operator_api.post("/api/v1/deployments/demo/traces/import?format=tandem&name=one",
                      data='{"at_s": 0, "prompt_tokens": 5, "completion_tokens": 2}', content_type="text/plain")
    unprofiled = viewer_api.post(URL, {"trace": "one"}, format="json")
    assert unprofiled.status_code == 400 and "no profile" in unprofiled.json()["error"]["message"]


def test_the_gate_refuses_halving_the_decode_pool_and_lets_a_harmless_change_through(fleet, operator_api,
                                                                                      viewer_api):
    """The gate replays the recorded trace's last window: the peak trace is copied into `recorded` first."""
    from controlplane.replay.models import Trace, TraceRequest

    peak, recorded = Trace.objects.get(name="peak"), Trace.objects.get_or_create(
        deployment=fleet, name="recorded", defaults={"start": Trace.objects.get(name="peak").start})[0]
    TraceRequest.objects.filter(trace=peak).update(trace=recorded)
    scale = "/api/v1/deployments/demo/scale"
    # Off by default: the change is applied as asked.
    assert viewer_api.get("/api/v1/deployments/demo/change-gate").json() == {"enabled": False, "window_s": 86400}
    assert viewer_api.put("/api/v1/deployments/demo/change-gate", {"enabled": True}, format="json").status_code == 403
    on = operator_api.put("/api/v1/deployments/demo/change-gate", {"enabled": True, "window_s": 3600}, format="json")
    assert on.status_code == 200 and on.json() == {"enabled": True, "window_s": 3600}
    assert operator_api.put("/api/v1/deployments/demo/change-gate", {"window_s": 5},
                            format="json").json()["error"]["field"] == "window_s"

    refused = operator_api.post(scale, {"role": "decode", "replicas": 1}, format="json")
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "prediction_below_objective" and "acknowledge_prediction" in error["message"]
    assert error["prediction"]["attainment_after"] < 0.99 <= error["prediction"]["attainment_before"]
    assert error["prediction"]["requests"] == 1200
    assert Pool.objects.get(deployment=fleet, role="decode").desired_replicas == 2  # nothing applied

    assert operator_api.post(scale, {"role": "decode", "replicas": 3}, format="json").status_code == 202
    assert Pool.objects.get(deployment=fleet, role="decode").desired_replicas == 3
    forced = operator_api.post(scale, {"role": "decode", "replicas": 1, "acknowledge_prediction": True},
                               format="json")
    assert forced.status_code == 202 and Pool.objects.get(deployment=fleet, role="decode").desired_replicas == 1
    beyond = operator_api.post(scale, {"role": "decode", "replicas": 99}, format="json")
    # A bound the pool refuses passes the gate untouched, to the service's own message.
    assert beyond.status_code == 400 and "change." not in json.dumps(beyond.json())


def test_the_gate_also_weighs_admission_settings(fleet, admin_api, operator_api):
    """Bursts the admission queue absorbs today: with no queue they are shed, which the gate refuses unless
    acknowledged."""
    from controlplane.replay.models import Trace, TraceRequest

    Deployment.objects.filter(pk=fleet.pk).update(objectives={"ttft_p99_seconds": 8.0, "itl_p99_seconds": 0.1,
                                                              "e2e_p99_seconds": 60.0})
    steady = [{"at_s": i / 10, "prompt_tokens": 50, "completion_tokens": 100} for i in range(600)]
    bursts = [{"at_s": at, "prompt_tokens": 50, "completion_tokens": 100} for at in (20.0, 40.0) for _ in range(100)]
    body = "\n".join(json.dumps(row) for row in steady + bursts)
    assert operator_api.post("/api/v1/deployments/demo/traces/import?format=tandem&name=bursts", data=body,
                             content_type="text/plain").status_code == 201
    recorded = Trace.objects.create(deployment=fleet, name="recorded", start=Trace.objects.get(name="bursts").start)
    TraceRequest.objects.filter(trace__name="bursts").update(trace=recorded)
    operator_api.put("/api/v1/deployments/demo/change-gate", {"enabled": True}, format="json")
    access = "/api/v1/deployments/demo/access"
    tight = {"admission": {"max_queued": 0}}
    refused = admin_api.patch(access, tight, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["prediction"]["shed"]["after"] > 0 == refused.json()["error"]["prediction"][
        "shed"]["before"]
    assert admin_api.get(access).json()["admission"] == {}  # nothing applied
    assert admin_api.patch(access, {"admission": {"max_queued": 4096}}, format="json").status_code == 200
    assert admin_api.patch(access, {**tight, "acknowledge_prediction": True}, format="json").status_code == 200
    assert admin_api.get(access).json()["admission"]["max_queued"] == 0


def test_the_gate_replays_the_newest_requests_of_a_busy_window(fleet, settings):
    """Past TANDEM_GATE_MAX_REQUESTS the window starts later, at the newest requests: the gate still predicts."""
    from controlplane.replay.gate import _since
    from controlplane.replay.models import Trace

    settings.TANDEM_GATE_MAX_REQUESTS = 200
    peak = Trace.objects.get(name="peak")
    assert _since(peak, 0.0) == pytest.approx(1000 / 20)  # the 200 newest of 1,200 arrivals at 20/s
    settings.TANDEM_GATE_MAX_REQUESTS = 5000
    assert _since(peak, 0.0) == 0.0


def test_an_advisory_autoscaler_does_not_scale_the_fleet_as_it_stands(fleet, viewer_api, operator_api):
    """As it stands, an advisory autoscaler only advises; turned active in the change, it scales in the replay."""
    Deployment.objects.filter(pk=fleet.pk).update(autoscale_enabled=True)
    assert operator_api.put("/api/v1/deployments/demo/autoscaling", {"mode": "advisory"},
                            format="json").status_code == 200
    report = viewer_api.post(URL, {"trace": "peak", "change": {"traffic": {"rate": 2}}}, format="json").json()
    assert report["fleet"]["before"]["autoscale"] is False and report["fleet"]["after"]["autoscale"] is False
    report = viewer_api.post(URL, {"trace": "peak", "change": {"autoscaling": {"enabled": True}}},
                             format="json").json()
    assert report["fleet"]["after"]["autoscale"] is True


def test_the_gate_weighs_turning_the_autoscaler_off(fleet, operator_api, settings):
    """One decode worker that the autoscaler grows as the peak comes: switching it off, or to advisory, leaves the
    peak on one worker, which the gate refuses unless acknowledged; a budget change replays nothing and passes."""
    from controlplane.autoscaling.models import AutoscalingPolicy
    from controlplane.replay.models import Trace, TraceRequest

    settings.TANDEM_REPLAY_STARTUP_S = 5
    recorded = Trace.objects.create(deployment=fleet, name="recorded", start=Trace.objects.get(name="peak").start)
    TraceRequest.objects.filter(trace__name="peak").update(trace=recorded)
    Pool.objects.filter(deployment=fleet, role="decode").update(desired_replicas=1)
    Deployment.objects.filter(pk=fleet.pk).update(autoscale_enabled=True)
    AutoscalingPolicy.objects.update_or_create(pool=Pool.objects.get(deployment=fleet, role="decode"), defaults={
        "enabled": True, "metric": "requests_running_per_worker", "target": 8})
    operator_api.put("/api/v1/deployments/demo/change-gate", {"enabled": True}, format="json")
    url = "/api/v1/deployments/demo/autoscaling"

    for change in ({"enabled": False}, {"mode": "advisory"}, {"pools": {"decode": {"enabled": False}}}):
        refused = operator_api.put(url, change, format="json")
        assert refused.status_code == 409, (change, refused.content)
        prediction = refused.json()["error"]["prediction"]
        assert prediction["attainment_after"] < prediction["attainment_before"], prediction
    assert Deployment.objects.get(pk=fleet.pk).autoscale_enabled is True  # nothing applied
    assert operator_api.get(url).json()["mode"] == "active"

    assert operator_api.put(url, {"max_workers": 8}, format="json").status_code == 200
    forced = operator_api.put(url, {"enabled": False, "acknowledge_prediction": True}, format="json")
    assert forced.status_code == 200 and forced.json()["enabled"] is False
