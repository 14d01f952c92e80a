"""A chaos experiment on the real stack: the decode worker paused (SIGSTOP by its node agent) for 3 s under a
trickle of client requests, released at its deadline, and a report that says so: fault injected and reverted, the
hypothesis before and during, the recovery time after, the requests the gateway counted, the verdict."""
from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest
import requests

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = pytest.mark.integration
CHAOS = f"deployments/{DEPLOYMENT}/chaos"


class Trickle(threading.Thread):
    """One client request after another (4 tokens each) until stopped; the status of each."""

    def __init__(self, gateway_url: str):
        super().__init__(daemon=True)
        self.gateway_url = gateway_url
        self.statuses: list[int] = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                self.statuses.append(completion(self.gateway_url, timeout=30).status_code)
            except requests.RequestException:
                self.statuses.append(0)
            self.halt.wait(0.2)


def test_a_paused_decode_worker_is_released_and_the_report_measures_the_recovery(live, deployment):
    decode, = [w for w in wait_steady(live) if w["role"] == "decode"]
    assert live.api("PUT", CHAOS, json={"enabled": True, "reason": "integration test"}).status_code == 200
    created = live.api("POST", f"{CHAOS}/experiments", json={
        "name": "pause-decode", "target": {"role": "decode", "count": 1},
        "faults": [{"kind": "pause"}], "duration_s": 3,
        "hypothesis": [{"metric": "error_ratio", "max": 0.05, "window_s": 4},
                       {"metric": "ttft_p99_seconds", "max": 2.0, "window_s": 4},
                       {"metric": "ready_workers", "role": "decode", "min": 1}],
        "abort_conditions": [{"metric": "error_ratio", "above": 0.9, "window_s": 4, "for_s": 10}],
        "recovery_timeout_s": 40})
    assert created.status_code == 201, created.text
    trickle = Trickle(deployment)
    trickle.start()
    try:
        def started():
            # The driver samples the gateway every 2 s: until its samples cover the 4 s windows, 409 not_steady.
            response = live.api("POST", f"{CHAOS}/experiments/pause-decode/run", json={})
            assert response.status_code in (201, 409), response.text
            if response.status_code == 409:
                assert response.json()["error"]["code"] == "not_steady", response.text
                return None
            return response.json()

        run = live.wait_for("the hypothesis to hold and the run to start", started, timeout=40, interval=1)
        assert run["targets"][0]["worker"] == decode["id"]

        def finished():
            body = live.api("GET", f"{CHAOS}/runs/{run['id']}").json()
            return body if body["status"] == "finished" else None

        live.wait_for("the run to finish", finished, timeout=60, interval=1)
    finally:
        trickle.halt.set()
        trickle.join(timeout=40)
    report = live.api("GET", f"{CHAOS}/runs/{run['id']}/report").json()
    print("chaos report:", {key: report[key] for key in ("verdict", "recovery_s", "requests")},
          report["hypothesis"]["during"], report["faults"])
    fault, = report["faults"]
    assert fault["injected"]["outcome"] == "paused", report
    assert fault["reverted"]["outcome"] == "resumed", report
    assert fault["reverted"]["by"] in ("the agent's deadline", "a revert")
    assert psutil.Process(decode["pid"]).status() != psutil.STATUS_STOPPED
    assert report["verdict"] == "passed", report
    assert report["recovery_s"] is not None and 0 <= report["recovery_s"] <= 40
    assert report["hypothesis"]["before"]["values"][2] == 1.0
    assert report["hypothesis"]["during"]["passes"] >= 1
    assert report["hypothesis"]["after"]["holds"] is True
    assert report["requests"]["sent"] > 0
    events = {a["params"].get("event") for a in live.actions(DEPLOYMENT) if a["params"].get("chaos_run") == run["id"]}
    assert {"chaos_started", "fault_injected", "fault_reverted", "chaos_finished"} <= events
    assert trickle.statuses and trickle.statuses.count(200) > 0

    assert live.api("PUT", CHAOS, json={"enabled": False}).status_code == 200
    assert live.api("DELETE", f"{CHAOS}/experiments/pause-decode").status_code == 204
    wait_steady(live)
    live.wait_for("the gateway to answer", lambda: completion(deployment).status_code == 200, timeout=30)


def test_a_pause_is_released_by_the_agent_when_the_control_worker_is_killed_mid_run(live, deployment):
    """kill -9 of the Celery control worker (the chaos driver, and here beat too) just after the pause is injected:
    nothing is left to send the revert, and the node agent releases the worker at the fault's deadline by itself;
    the restarted control worker then finishes the run. Nothing is left stopped."""
    decode, = [w for w in wait_steady(live) if w["role"] == "decode"]
    assert live.api("PUT", CHAOS, json={"enabled": True, "reason": "integration test"}).status_code == 200
    created = live.api("POST", f"{CHAOS}/experiments", json={
        "name": "orphaned-pause", "target": {"role": "decode", "count": 1}, "faults": [{"kind": "pause"}],
        "duration_s": 3, "hypothesis": [{"metric": "ready_workers", "role": "decode", "min": 1}],
        "recovery_timeout_s": 60})
    assert created.status_code == 201, created.text
    run = live.wait_for("the run to start", lambda: (lambda r: r.json() if r.status_code == 201 else None)(
        live.api("POST", f"{CHAOS}/experiments/orphaned-pause/run", json={})), timeout=40, interval=1)
    worker = psutil.Process(decode["pid"])
    live.wait_for("the agent to pause the decode worker", lambda: worker.status() == psutil.STATUS_STOPPED,
                  timeout=30, interval=0.05)
    control = live.stack.pid("control")
    os.killpg(control, signal.SIGKILL)  # its group: the worker and its embedded beat, which would live on alone
    try:
        # No revert message can come now: the agent's own timer must release the worker at the deadline.
        live.wait_for("the agent to release the worker", lambda: worker.status() != psutil.STATUS_STOPPED,
                      timeout=30, interval=0.1)
        reverted = live.wait_for("the revert row", lambda: next(
            (a for a in live.actions(DEPLOYMENT) if a["params"].get("chaos_run") == run["id"]
             and a["params"].get("event") == "fault_reverted"), None), timeout=30)
        assert reverted["result"]["outcome"] == "resumed", reverted
        assert reverted["result"]["by"] == "the agent's deadline", reverted
        # The supervisor starts the control worker again (wait_for polls it), and its driver ends the run.
        live.wait_for("the control worker to be started again",
                      lambda: live.stack.pid("control") not in (None, control) and live.stack.is_running("control"),
                      timeout=60)
        live.wait_for("the run to finish", lambda: live.api("GET", f"{CHAOS}/runs/{run['id']}").json()["status"]
                      == "finished", timeout=120, interval=1)
        assert worker.status() != psutil.STATUS_STOPPED
    finally:
        if worker.is_running() and worker.status() == psutil.STATUS_STOPPED:
            worker.resume()  # never leave the shared stack's worker stopped, whatever failed above
    live.wait_for("the control worker", lambda: live.stack.is_running("control"), timeout=60)
    assert live.api("PUT", CHAOS, json={"enabled": False}).status_code == 200
    assert live.api("DELETE", f"{CHAOS}/experiments/orphaned-pause").status_code == 204
    wait_steady(live)
