"""A deployment's admission settings come with the membership poll and override the gateway's flags (what they leave
out, the flags say); a bad one is refused like any bad answer, keeping the last good settings. Checked one value at
a time, then a real gateway (one slot: a simulated worker of --max-num-seqs 1, headroom 0) whose stand-in control
plane says: one request may wait, for 1 s at most."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from inference.gateway.admission_settings import AdmissionSettingsError, check_admission_settings
from inference.gateway.membership import MembershipError, parse_admission
from tests.inference.gateway.support import TOKEN, ControlPlane, start_gateway, stop_all
from tests.procs import free_port, start, wait_http


def test_settings_are_checked_and_left_out_ones_stay_unsaid():
    assert check_admission_settings({}) == {}
    assert check_admission_settings({"max_queued": 0, "queue_deadlines": {"batch": 600}}) == {
        "max_queued": 0, "queue_deadlines": {"batch": 600.0}}
    preemption = {"max_preemptions": 0, "preempt_margin": 12.5, "preempt_min_tokens_left": 8}
    assert check_admission_settings(preemption) == preemption
    assert parse_admission({}) == {} and parse_admission({"admission": None}) == {}


@pytest.mark.parametrize(("settings", "param"), [
    ([], "admission"),
    ({"max_waiting": 3}, "max_waiting"),
    ({"max_queued": -1}, "max_queued"),
    ({"max_queued": 1.5}, "max_queued"),
    ({"max_queued": True}, "max_queued"),
    ({"queue_deadlines": [1]}, "queue_deadlines"),
    ({"queue_deadlines": {"premium": 5}}, "queue_deadlines.premium"),
    ({"queue_deadlines": {"batch": 0}}, "queue_deadlines.batch"),
    ({"queue_deadlines": {"batch": float("inf")}}, "queue_deadlines.batch"),
    ({"queue_deadlines": {"batch": "5"}}, "queue_deadlines.batch"),
    ({"max_preemptions": -1}, "max_preemptions"),
    ({"max_preemptions": 101}, "max_preemptions"),
    ({"max_preemptions": 1.5}, "max_preemptions"),
    ({"preempt_margin": float("nan")}, "preempt_margin"),
    ({"preempt_margin": -1}, "preempt_margin"),
    ({"preempt_margin": True}, "preempt_margin"),
    ({"preempt_min_tokens_left": "4"}, "preempt_min_tokens_left"),
])
def test_a_bad_setting_names_its_field(settings, param):
    with pytest.raises(AdmissionSettingsError) as raised:
        check_admission_settings(settings)
    assert raised.value.param == param
    with pytest.raises(MembershipError, match=param):
        parse_admission({"admission": settings})


def _shed_codes(gateway_url: str) -> dict[str, float]:
    codes = {}
    for line in requests.get(gateway_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tandem_gateway_queue_shed_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            codes[reason] = codes.get(reason, 0) + float(line.rsplit(" ", 1)[1])
    return codes


@pytest.mark.integration
def test_the_deployment_bounds_the_queue_and_the_wait(tmp_path):
    port = free_port()
    # smollm2-cpu: its one sequence of 200 tokens takes seconds, longer than the deadline below.
    worker = start("sim-colocated", ["-m", "inference.worker", "--simulate", "smollm2-cpu", "--role", "colocated",
                                     "--model", "/models/sim-model", "--port", str(port), "--max-num-seqs", "1"],
                   tmp_path)
    control_plane = ControlPlane()
    procs = [worker]
    try:
        worker_url = f"http://127.0.0.1:{port}"
        wait_http(worker, worker_url + "/health", timeout=60)
        control_plane.start()
        control_plane.endpoints.update({
            "groups": [{"revision": 1, "prefill": [], "decode": [], "colocated": [worker_url]}],
            "admission": {"max_queued": 1, "queue_deadlines": {"standard": 1}}})
        gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo", "--token",
                                            TOKEN, "--worker-capacity-headroom", "0"], tmp_path)
        procs.insert(0, gateway)
        answers = {}

        def send(name: str) -> None:
            resp = requests.post(gateway.url + "/v1/completions", timeout=120, json={
                "model": "demo", "prompt": "one two three", "max_tokens": 200})
            answers[name] = (resp.status_code, resp.json().get("error", {}).get("code"))

        long_one = threading.Thread(target=send, args=("running",))
        long_one.start()
        _wait_metric(gateway.url, "tandem_gateway_admission_running", 1)  # the one slot is taken
        waiting = threading.Thread(target=send, args=("waiting",))
        waiting.start()
        _wait_metric(gateway.url, "tandem_gateway_queue_length", 1)
        send("refused")  # the queue holds one: 429 at once
        waiting.join(30)
        long_one.join(120)
        assert answers["refused"] == (429, "queue_full")
        assert answers["waiting"] == (503, "queue_timeout")  # 1 s, not the flag's 30 s
        assert answers["running"] == (200, None)
        assert _shed_codes(gateway.url) == {"queue_full": 1.0, "queue_timeout": 1.0}
    finally:
        stop_all(procs)
        control_plane.stop()


def _wait_metric(gateway_url: str, name: str, value: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        lines = requests.get(gateway_url + "/metrics", timeout=10).text.splitlines()
        if sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{")) >= value:
            return
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)
