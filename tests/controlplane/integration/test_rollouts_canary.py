"""Canary and A/B rollouts end to end: the real stack (web, Celery control worker with beat, node agent), real
tiny-model workers and the real gateway, which splits traffic by the endpoints answer's traffic_weight and names
the revision that served each response in X-Tandem-Revision.

Each test leaves the deployment with 1 prefill and 1 decode ready (of whatever revision is current), and none
depends on another having run."""
from __future__ import annotations

import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.controlplane.integration.conftest import DEPLOYMENT, wait_steady

pytestmark = pytest.mark.integration
ROLLOUTS = f"deployments/{DEPLOYMENT}/rollouts"
CHAOS = f"deployments/{DEPLOYMENT}/chaos"
SETTINGS = {"threads": 1, "kv_cache_bytes": 16 << 20}


def _request(gateway_url: str, *, user: str | None = None, timeout: float = 30) -> requests.Response:
    body = {"model": DEPLOYMENT, "prompt": "Count: one, two,", "max_tokens": 3, "temperature": 0}
    if user is not None:
        body["user"] = user
    return requests.post(f"{gateway_url}/v1/completions", json=body, timeout=timeout)


class Clients(threading.Thread):
    """A steady trickle of requests; each outcome is kept with the revision that served it (the response header)
    and the time it came back."""

    def __init__(self, gateway_url: str, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.gateway_url, self.interval_s = gateway_url, interval_s
        self.outcomes: list[tuple[float, str, int | str]] = []  # (time, revision header, status or exception)
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            try:
                response = _request(self.gateway_url)
                self.outcomes.append((time.monotonic(), response.headers.get("X-Tandem-Revision", ""),
                                      response.status_code))
            except requests.RequestException as exc:
                self.outcomes.append((time.monotonic(), "", repr(exc)))
            time.sleep(self.interval_s)

    def stop(self):
        self.stopped.set()
        self.join(60)

    def failed(self, revision: str | None = None) -> list:
        return [o for o in self.outcomes if o[2] != 200 and (revision is None or o[1] == revision)]

    def served_by(self, revision: str) -> int:
        return sum(1 for o in self.outcomes if o[1] == revision and o[2] == 200)


def _start(live, body: dict) -> dict:
    response = live.api("POST", ROLLOUTS, json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _rollout(live, rollout_id: int) -> dict:
    response = live.api("GET", f"{ROLLOUTS}/{rollout_id}")
    response.raise_for_status()
    return response.json()


def _wait_status(live, rollout_id: int, statuses: tuple[str, ...], timeout: float = 240) -> dict:
    return live.wait_for(f"rollout {rollout_id} to be {' or '.join(statuses)}",
                         lambda: (r := _rollout(live, rollout_id))["status"] in statuses and r, timeout=timeout)


def _gateway_errors(live, gateway_url: str, revision: str) -> float:
    """Requests the gateway counted as failed on `revision` (its tandem_request_errors_total)."""
    text = live.gateway_metrics(gateway_url)
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "tandem_request_errors_total" and sample.labels.get("revision") == revision)


def _current(live) -> int:
    return live.api("GET", f"deployments/{DEPLOYMENT}/").json()["current_revision"]


def _settle(live, revision: int) -> None:
    """Until the rollout's own action is done and only `revision`'s 1 + 1 workers serve."""
    wait_steady(live, revision=revision, timeout=180)


def test_a_healthy_canary_walks_its_steps_and_is_promoted_without_a_failed_request(live, deployment):
    stable = _current(live)
    _settle(live, stable)
    clients = Clients(deployment)
    clients.start()
    try:
        rollout = _start(live, {
            "revision": {"engine_settings": SETTINGS, "comment": "healthy canary"}, "strategy": "canary",
            "steps": [{"weight": 30, "duration_s": 8}, {"weight": 60, "duration_s": 8}],
            # Both revisions are the same model on a loaded 2-core host: latency noise, not a regression, is what a
            # tight ratio would catch here; the ratio's own behaviour is unit-tested.
            "analysis": {"min_requests": 5, "interval_s": 2, "max_latency_ratio": 10}})
        promoted = _wait_status(live, rollout["id"], ("promoted", "aborted"), timeout=300)
        assert promoted["status"] == "promoted", promoted
        assert [run["verdict"] for run in promoted["analysis_runs"]] == ["passed", "passed"]
        _settle(live, rollout["revision"])
        time.sleep(1)  # a few requests on the promoted revision alone
    finally:
        clients.stop()
    assert clients.failed() == []
    assert clients.served_by(str(rollout["revision"])) >= 10 and clients.served_by(str(stable)) >= 10
    steps = [a for a in live.actions(DEPLOYMENT, kind="rollout") if a["params"].get("rollout") == rollout["id"]
             and a["params"].get("event") == "step"]
    assert sorted(a["params"]["step"] for a in steps) == [1, 2]  # each step moved on from once


def _fail_canary(live, revision: int) -> dict:
    """A chaos run whose fault makes the canary's prefill worker answer every generation request with a 500: its
    node agent puts a fault proxy in front of it, which the gateway's membership then names (docs/chaos.md)."""
    assert live.api("PUT", CHAOS, json={"enabled": True, "reason": "canary test"}).status_code == 200
    name = f"fail-canary-{revision}"
    created = live.api("POST", f"{CHAOS}/experiments", json={
        "name": name, "target": {"role": "prefill", "revision": revision, "count": 1},
        "faults": [{"kind": "error", "ratio": 1}], "duration_s": 300,
        "hypothesis": [{"metric": "ready_workers", "role": "prefill", "min": 1}], "recovery_timeout_s": 60})
    assert created.status_code == 201, created.text
    live.wait_for(f"revision {revision}'s prefill worker to be ready", lambda: any(
        w["role"] == "prefill" and w["revision"] == revision and w["status"] == "ready"
        for w in live.workers(DEPLOYMENT)), timeout=240)
    started = live.api("POST", f"{CHAOS}/experiments/{name}/run", json={})
    assert started.status_code == 201, started.text
    run = started.json()
    live.wait_for("the agent to put the fault proxy in place", lambda: any(
        a["params"].get("event") == "fault_injected" and a["params"].get("chaos_run") == run["id"]
        and a["status"] == "succeeded" for a in live.actions(DEPLOYMENT)), timeout=60)
    return run


def test_a_canary_that_answers_errors_is_aborted_and_no_client_sees_a_failure(live, deployment):
    stable = _current(live)
    _settle(live, stable)
    interval_s, min_requests = 2, 5
    clients = Clients(deployment, interval_s=0.1)
    clients.start()
    run = None
    try:
        rollout = _start(live, {
            "revision": {"engine_settings": SETTINGS, "comment": "broken canary"},
            "strategy": "canary", "steps": [{"weight": 50, "duration_s": 600}],
            "analysis": {"min_requests": min_requests, "interval_s": interval_s}})
        tried = str(rollout["revision"])
        run = _fail_canary(live, rollout["revision"])
        # Each request the canary fails before its first token is answered by stable, and counted on the canary's
        # series, which the analysis reads: wait until the gateway counted min_requests of them.
        judged_from = live.wait_for(
            f"{min_requests} requests failed on the canary",
            lambda: _gateway_errors(live, deployment, tried) >= min_requests and time.monotonic(), timeout=240)
        aborted = _wait_status(live, rollout["id"], ("aborted", "promoted"), timeout=90)
        aborted_at = time.monotonic()
        assert aborted["status"] == "aborted", aborted
        # The goal is one interval + 10 s (issue 10's); on a loaded CI host the periodic passes queue behind
        # each other, so the test allows 15 s more. Far below the step's 600 s: the analysis aborted it.
        print(f"aborted {aborted_at - judged_from:.1f} s after the canary's {min_requests}th request")
        assert aborted_at - judged_from <= interval_s + 10 + 15
        # Traffic is back on stable from the gateway's next membership poll (every 2 s; later on a loaded host):
        # at least 4 s after the abort and 10 answers in a row from stable (1 in 1,024 at the canary's 50 %).
        def back_on_stable():
            recent = [o for o in clients.outcomes if o[0] > aborted_at + 4][-10:]
            return len(recent) == 10 and all(o[1] == str(stable) for o in recent) and recent[0][0]
        after = live.wait_for("the gateway to route every request to stable again", back_on_stable, timeout=60)
        time.sleep(3)  # a window of requests that must all stay on stable
    finally:
        clients.stop()
        if run is not None:
            live.api("POST", f"{CHAOS}/runs/{run['id']}/abort", json={"reason": "the canary test is over"})
    # Not one client failure: what the canary failed, stable answered.
    assert clients.failed() == [], clients.failed()
    assert not [o for o in clients.outcomes if o[0] > after and o[1] != str(stable)]
    print(f"requests the canary failed before the abort, answered by stable: {_gateway_errors(live, deployment, tried):.0f}")
    abort = next(a for a in live.actions(DEPLOYMENT, kind="abort") if a["params"].get("rollout") == rollout["id"])
    assert "error_ratio" in {f["metric"] for f in abort["params"]["failures"]}
    _settle(live, stable)
    assert _current(live) == stable


def test_an_ab_split_of_50_50_lands_within_40_to_60_percent_and_is_sticky_per_user(live, deployment):
    stable = _current(live)
    _settle(live, stable)
    rollout = _start(live, {"revision": {"engine_settings": SETTINGS, "comment": "B"}, "strategy": "ab",
                            "split": 50, "duration_s": 900, "analysis": {"interval_s": 2}})
    tried = str(rollout["revision"])
    live.wait_for("the gateway to serve B", lambda: _request(deployment).headers.get("X-Tandem-Revision") == tried,
                  timeout=240, interval=0.5)
    served = {}
    for i in range(200):
        response = _request(deployment, user=f"user-{i}")
        assert response.status_code == 200, response.text
        served[f"user-{i}"] = response.headers["X-Tandem-Revision"]
    share_b = sum(1 for revision in served.values() if revision == tried) / len(served)
    assert 0.40 <= share_b <= 0.60, share_b
    for user in list(served)[:30]:
        assert _request(deployment, user=user).headers["X-Tandem-Revision"] == served[user], user
    headed = requests.post(f"{deployment}/v1/completions", timeout=30, headers={"X-Tandem-Variant-Key": "user-7"},
                           json={"model": DEPLOYMENT, "prompt": "Hi", "max_tokens": 2})
    assert headed.headers["X-Tandem-Revision"] == served["user-7"]

    report = live.wait_for("the report to count both variants", lambda: (
        r := live.api("GET", f"{ROLLOUTS}/{rollout['id']}/report").json())["analysis_runs"]
        and all(v["requests"] for v in r["analysis_runs"][0]["variants"].values()) and r, timeout=60)
    assert report["analysis_runs"][0]["significance"]["note"].startswith("at alpha")
    csv_text = live.api("GET", f"{ROLLOUTS}/{rollout['id']}/report.csv").text
    assert csv_text.splitlines()[0].startswith("rollout,step,verdict") and len(csv_text.splitlines()) == 3
    assert _rollout(live, rollout["id"])["status"] == "running"  # an experiment never promotes by itself
    assert live.api("POST", f"{ROLLOUTS}/{rollout['id']}/abort", json={"reason": "experiment done"}).ok
    _settle(live, stable)


def test_a_rollout_resumes_its_step_after_the_celery_worker_is_killed(live, deployment):
    from controlplane.agent import processes

    stable = _current(live)
    _settle(live, stable)
    rollout = _start(live, {"revision": {"engine_settings": SETTINGS, "comment": "survives a restart"},
                            "strategy": "canary", "steps": [{"weight": 20, "duration_s": 10, "analysis": False},
                                      {"weight": 50, "duration_s": 10, "analysis": False}]})
    first = live.wait_for("step 1's timer to start",
                          lambda: (r := _rollout(live, rollout["id"]))["step_started_at"] and r, timeout=240)
    control = live.stack.children["control"]
    processes.signal_group(control.handle, 9)  # SIGKILL mid-step: no clean shutdown
    # live.wait_for polls the stack, which starts the control worker again.
    promoted = _wait_status(live, rollout["id"], ("promoted", "aborted"), timeout=240)
    assert promoted["status"] == "promoted"
    events = [a["params"] for a in live.actions(DEPLOYMENT, kind="rollout")
              if a["params"].get("rollout") == rollout["id"] and a["params"].get("event") == "step"]
    assert sorted(e["step"] for e in events) == [1, 2]
    assert first["step"] == 1
    _settle(live, rollout["revision"])
