"""Every built-in experiment template (controlplane.chaos.library) run end to end on a simulated fleet: a real
control plane, Celery, chaos driver and gateway, and simulated workers in a simulated worker host, whose node agent
carries out each fault (a kill closes the worker as SIGKILL would, a pause holds it, the proxy faults put the real
fault proxy in front of its port, a broker freeze holds the real broker's freeze lock, an agent kill stops the
node's simulated agent until its restart, a db slow holds the write lock of the stack's own SQLite file). Under a
steady trickle of client requests each run must start (the hypothesis holds before), inject, revert every fault,
recover and pass; a resource fault is refused with a 400, since a simulated fleet's nodes share one real host; a db
slow is skipped on PostgreSQL (SHARED_DATABASE).

One stack for all templates (CI time): the templates' hypothesis windows are shortened to WINDOW_S and their
duration to DURATION_S (after a partition's onset), so that a run takes seconds; what each checks, its bounds and its
abort condition are the template's.

The workers' profile is tiny-cpu with a prefill of PREFILL_S: the gateway's TTFT P99 is read from histogram buckets
(inference.metrics.TTFT_BUCKETS), and a TTFT of a few milliseconds sits where one scheduling hiccup of a loaded
machine moves it up a bucket, past 1.5x its baseline; from (0.5, 0.75] it takes a request slower than 1 s."""
from __future__ import annotations

import copy
import json
import os
import threading

import pytest
import requests

from controlplane.agent.fault_kinds import Family, kinds_of
from controlplane.chaos.library import TEMPLATES, template_fields
from inference.worker.sim_profile import BUILTIN
from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import free_port

pytestmark = pytest.mark.integration
PROXY_KINDS, RESOURCE_KINDS = kinds_of(Family.PROXY), kinds_of(Family.RESOURCE)

NAME = "sim-chaos"
CHAOS = f"deployments/{NAME}/chaos"
DURATION_S = 2
WINDOW_S = 3
PREFILL_S = 0.55
INJECTED = {"kill": "killed", "pause": "paused", **{kind: "proxied" for kind in PROXY_KINDS}, "broker_freeze": "frozen",
            "agent_kill": "killed", "db_slow": "throttled"}
REVERTED = {"kill": "nothing-to-revert", "pause": "resumed", **{kind: "restored" for kind in PROXY_KINDS},
            "broker_freeze": "thawed", "agent_kill": "restarted", "db_slow": "released"}
# On PostgreSQL the stack's database lives in the machine's shared server (IsolatedServices), which a db_slow would
# throttle for every other user of it: that template runs on SQLite only (the stack's own file).
SHARED_DATABASE = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))


class Trickle(threading.Thread):
    """Client requests one after another until halted: the traffic the gateway's counters (and so the hypothesis)
    are made of; what each answered is the report's business."""

    def __init__(self, gateway_url: str):
        super().__init__(daemon=True)
        self.gateway_url = gateway_url
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                requests.post(f"{self.gateway_url}/v1/completions", timeout=15, json={
                    "model": NAME, "prompt": "one two three", "max_tokens": 4})
            except requests.RequestException:
                pass
            self.halt.wait(0.05)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model_dir):
    var_dir = tmp_path_factory.mktemp("tandem-sim-chaos")
    services = IsolatedServices(var_dir)
    stack, trickles = None, []
    try:
        stack = live_stack_start(var_dir, services, simulated_nodes=2, simulated_hosts=1)
        profile = copy.deepcopy(BUILTIN["tiny-cpu"])
        for role in ("prefill", "colocated"):
            profile["roles"][role]["prefill"]["a"] = PREFILL_S
        (var_dir / "steady.json").write_text(json.dumps({**profile, "name": "tiny-cpu-steady"}))
        gateway_port = free_port()
        response = stack.api("POST", "deployments/", json={
            "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir),
            "engine_settings": {"simulate": str(var_dir / "steady.json")}, "replicas": {"prefill": 2, "decode": 2},
            "gateway_port": gateway_port})
        assert response.status_code == 202, response.text
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        stack.wait_for("2 prefill and 2 decode ready", lambda: len(
            [w for w in stack.workers(NAME) if w["status"] == "ready" and w["role"] in ("prefill", "decode")]) == 4,
            timeout=120)
        stack.wait_for("the gateway to answer", lambda: _answers(gateway_url), timeout=120, interval=0.5)
        assert stack.api("PUT", CHAOS, json={"enabled": True, "reason": "template tests"}).status_code == 200
        # One client: two at once could queue on one prefill worker, as slow as a fault.
        trickles = [Trickle(gateway_url)]
        for trickle in trickles:
            trickle.start()
        yield stack
    finally:
        for trickle in trickles:
            trickle.halt.set()
        for trickle in trickles:
            trickle.join(timeout=20)
        if stack is not None:
            live_stack_stop(stack)
        services.close()


def _answers(gateway_url: str) -> bool:
    try:
        return requests.post(f"{gateway_url}/v1/completions", timeout=10, json={
            "model": NAME, "prompt": "one", "max_tokens": 2}).status_code == 200
    except requests.RequestException:
        return False


def _held_workers(fleet) -> list[dict]:
    """The simulated workers their host holds paused (one host: simulated_hosts=1)."""
    host_url, = json.loads((fleet.var_dir / f"simfleet-{fleet.node_name}.json").read_text())["hosts"]
    return [w for w in requests.get(f"{host_url}/workers", timeout=10).json()["workers"] if w["paused"]]


def _shortened(fields: dict) -> dict:
    return {**fields, "hypothesis": [{**check, "window_s": WINDOW_S} if "window_s" in check else check
                                     for check in fields["hypothesis"]]}


def _refused(fleet, name: str):
    """The answer to a run of `name` that its faults' hosts refuse: the hypothesis is judged first, so a 409 (not
    yet steady, as after the last run's fault) is waited out. (In a list: a Response of 400 is falsy.)"""
    response, = fleet.wait_for(f"experiment {name}'s run to be judged", lambda: (
        lambda answer: [answer] if answer.status_code != 409 else None)(
        fleet.api("POST", f"{CHAOS}/experiments/{name}/run", json={})), timeout=60, interval=0.5)
    return response


def _start(fleet, name: str) -> dict:
    def started():
        response = fleet.api("POST", f"{CHAOS}/experiments/{name}/run", json={})
        if response.status_code == 409:
            # not yet steady (the last run's fault is still in the window), or a worker not yet ready again
            return None
        assert response.status_code == 201, response.text
        return response.json()

    return fleet.wait_for(f"experiment {name} to start", started, timeout=60, interval=0.5)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda template: template.key)
def test_the_template_runs_on_simulated_workers_and_reverts_every_fault(fleet, template):
    if SHARED_DATABASE and any(fault["kind"] == "db_slow" for fault in template.faults):
        pytest.skip("db_slow would throttle the shared PostgreSQL server that holds this stack's database")
    fields = _shortened(template_fields(template, role=template.role, count=1, duration_s=template.duration_s))
    created = fleet.api("POST", f"{CHAOS}/experiments", json={"name": template.key, **fields})
    assert created.status_code == 201, created.text
    # A partition begins onset_s in (as validated, its default filled in): it lasts DURATION_S from then.
    onset_s = max((fault.get("onset_s", 0) for fault in created.json()["faults"]), default=0)
    shortened = fleet.api("PATCH", f"{CHAOS}/experiments/{template.key}", json={"duration_s": DURATION_S + onset_s})
    assert shortened.status_code == 200, shortened.text
    kinds = {fault["kind"] for fault in template.faults}
    if kinds & set(RESOURCE_KINDS):
        refused = _refused(fleet, template.key)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["field"] == "faults[0].kind" and "simulated" in refused.text, refused.text
        return

    run = _start(fleet, template.key)
    body = fleet.wait_for(f"run {run['id']} to finish", lambda: (
        lambda b: b if b["status"] in ("finished", "aborted") else None)(
        fleet.api("GET", f"{CHAOS}/runs/{run['id']}").json()), timeout=90, interval=0.5)
    report = fleet.api("GET", f"{CHAOS}/runs/{run['id']}/report").json()
    summary = {key: report[key] for key in ("verdict", "reasons", "recovery_s", "requests", "faults")}
    assert body["status"] == "finished" and report["verdict"] == "passed", summary
    assert report["faults"] and all(
        fault["injected"]["outcome"] == INJECTED[fault["kind"]] and fault["reverted"] is not None
        and fault["reverted"]["outcome"] == REVERTED[fault["kind"]] for fault in report["faults"]), summary
    assert report["hypothesis"]["after"]["holds"] is True and report["requests"]["sent"] > 0, summary

    # Reverted for real: no worker is held by its host, and the membership the gateway polls (worker URLs, KV
    # addresses) names no fault proxy.
    assert _held_workers(fleet) == []
    if "agent_kill" in kinds:
        # The restarted agent adopted the node's workers: the target was neither restarted nor replaced.
        worker, = [fault["worker"] for fault in report["faults"]]
        reverted = fleet.action(report["faults"][0]["reverted"]["action"])["result"]
        assert worker in reverted["adopted"] and reverted["by"] == "the agent's restart", reverted
        after = fleet.api("GET", f"workers/{worker}/").json()
        assert after["status"] == "ready" and after["pid"] == run["targets"][0]["pid"], after
    for fault in report["faults"]:
        if fault["kind"] == "kill":
            # Supervision saw what it sees of a SIGKILLed process, and restarted it.
            fleet.wait_for(f"the restart of worker {fault['worker']}", lambda w=fault["worker"]: [
                a for a in fleet.actions(NAME, kind="restart") if a["worker"] == w
                and a["reason"].startswith("process killed by signal 9 (SIGKILL)")], timeout=30)
        injected = fleet.action(fault["injected"]["action"])["result"]
        if "proxy_port" in injected:
            endpoints = fleet.api("GET", f"deployments/{NAME}/endpoints")
            assert endpoints.status_code == 200 and f":{injected['proxy_port']}" not in endpoints.text, endpoints.text


def test_a_node_target_runs_on_that_nodes_workers_only(fleet):
    """A node as the target, on the same stack: the run's targets are the decode workers placed on that simulated
    node, its pause is carried by that node's agent and reverted, and the run passes; an unknown node is a 400 naming
    target.node, and a node-level fault on that node the simulated host's 400, naming the node."""
    ready = fleet.wait_for("2 ready decode workers, on two nodes", lambda: (lambda workers: workers if len(
        {w["node"] for w in workers}) == 2 else None)([w for w in fleet.workers(NAME) if w["status"] == "ready"
                                                      and w["role"] == "decode"]), timeout=60)
    node = ready[0]["node"]
    on_node = {w["id"] for w in ready if w["node"] == node}
    template, = [t for t in TEMPLATES if t.key == "decode-hang"]
    fields = _shortened(template_fields(template, role="decode", count=1, duration_s=DURATION_S))

    unknown = fleet.api("POST", f"{CHAOS}/experiments", json={**fields, "name": "nowhere",
                                                              "target": {"node": "nowhere"}})
    assert unknown.status_code == 400 and unknown.json()["error"]["field"] == "target.node", unknown.text
    hog = fleet.api("POST", f"{CHAOS}/experiments", json={**fields, "name": "node-hog", "target": {"node": node},
                                                          "faults": [{"kind": "cpu_hog"}]})
    assert hog.status_code == 201, hog.text
    refused = _refused(fleet, "node-hog")
    assert refused.status_code == 400 and node in refused.json()["error"]["message"], refused.text

    created = fleet.api("POST", f"{CHAOS}/experiments", json={**fields, "name": "node-hang",
                                                              "target": {"node": node, "role": "decode"}})
    assert created.status_code == 201 and created.json()["target"] == {"node": node, "role": "decode"}, created.text
    run = _start(fleet, "node-hang")
    assert {t["node"] for t in run["targets"]} == {node} and {t["worker"] for t in run["targets"]} == on_node, run
    body = fleet.wait_for(f"run {run['id']} to finish", lambda: (
        lambda b: b if b["status"] == "finished" else None)(
        fleet.api("GET", f"{CHAOS}/runs/{run['id']}").json()), timeout=90, interval=0.5)
    report = fleet.api("GET", f"{CHAOS}/runs/{run['id']}/report").json()
    summary = {key: report[key] for key in ("verdict", "reasons", "recovery_s", "faults")}
    assert body["verdict"] == "passed", summary
    assert {fault["worker"] for fault in report["faults"]} == on_node and all(
        fault["injected"]["outcome"] == "paused" and fault["reverted"]["outcome"] == "resumed"
        for fault in report["faults"]), summary
    assert _held_workers(fleet) == []
