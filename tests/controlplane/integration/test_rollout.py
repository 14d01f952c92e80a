"""A new revision, then a rollback, replace the workers of both pools by a rolling replacement while a steady
trickle of requests goes through the gateway: every request succeeds."""
from __future__ import annotations

import threading
import time

import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = [pytest.mark.integration, pytest.mark.backends]


class Trickle(threading.Thread):
    """One completion every interval_s; records every outcome."""

    def __init__(self, gateway_url: str, interval_s: float = 0.3):
        super().__init__(daemon=True)
        self.gateway_url, self.interval_s = gateway_url, interval_s
        self.num_ok, self.failures = 0, []
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            try:
                response = completion(self.gateway_url, prompt="Count: one, two,", max_tokens=4, timeout=30)
                if response.status_code == 200:
                    self.num_ok += 1
                else:
                    self.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
            except Exception as exc:
                self.failures.append(repr(exc))
            time.sleep(self.interval_s)


def _roll(live, method_path: tuple[str, str], body: dict, *, to_revision: int | None,
          old_ids: set[int]) -> int:
    """Roll to `to_revision` (None: the revision the request creates); returns its number."""
    response = live.api(*method_path, json=body)
    assert response.status_code == 202, response.text
    action = response.json()["action"]
    if to_revision is None:
        to_revision = response.json()["revision"]["number"]
    live.wait_for(f"the {action['kind']} action to succeed",
                  lambda: live.action(action["id"])["status"] in ("succeeded", "failed"), timeout=150)
    assert live.action(action["id"])["status"] == "succeeded", live.action(action["id"])
    ready = wait_steady(live, revision=to_revision)
    assert not old_ids & {w["id"] for w in ready}  # both pools: all new workers
    for worker_id in old_ids:
        assert live.api("GET", f"workers/{worker_id}/").json()["status"] == "stopped"
    return to_revision


def test_a_new_revision_and_a_rollback_replace_both_pools_without_a_failed_request(live, deployment):
    """Whatever revision the shared stack is at (other tests roll it too): a new one, then back."""
    def nothing_in_flight() -> bool:
        return not any(live.api("GET", "actions/", params={"deployment": DEPLOYMENT, "status": status}).json()[
            "results"] for status in ("pending", "running"))

    live.wait_for("no action of another test in flight (a rollout's promotion ends after its workers)",
                  nothing_in_flight, timeout=180)
    stable = live.api("GET", f"deployments/{DEPLOYMENT}/").json()["current_revision"]
    stable_ids = {w["id"] for w in wait_steady(live, revision=stable)}
    trickle = Trickle(deployment)
    trickle.start()
    try:
        new = _roll(live, ("POST", f"deployments/{DEPLOYMENT}/revisions/"),
                    {"engine_settings": {"threads": 1, "kv_cache_bytes": 8 << 20}, "comment": "smaller KV pool"},
                    to_revision=None, old_ids=stable_ids)
        assert new > stable
        new_ids = {w["id"] for w in wait_steady(live, revision=new)}
        num_after_revision = trickle.num_ok
        _roll(live, ("POST", f"deployments/{DEPLOYMENT}/rollback"), {"revision": stable},
              to_revision=stable, old_ids=new_ids)
        num_after_rollback = trickle.num_ok
        live.wait_for("a few more requests on the rolled-back group",
                      lambda: trickle.num_ok >= num_after_rollback + 3, timeout=60)
    finally:
        trickle.stopped.set()
        trickle.join(60)
    assert trickle.failures == []
    # Requests were served through both rolls (how many drifts with the host's speed: at least a few).
    assert num_after_revision >= 3 and num_after_rollback > num_after_revision
    deployment_row = live.api("GET", f"deployments/{DEPLOYMENT}/").json()
    assert deployment_row["current_revision"] == stable


def test_a_rollback_right_after_a_new_revisions_workers_are_ready_preempts_it_without_a_failed_request(
        live, deployment):
    """The one-click rollback of a bad revision does not wait for its replacement to end: sent as soon as the new
    revision's workers are ready (the old ones may still drain), it is accepted, names the replacement it preempts,
    and the stable revision serves again with no client request failed."""
    live.wait_for("no action of another test in flight", lambda: not any(
        live.api("GET", "actions/", params={"deployment": DEPLOYMENT, "status": status}).json()["results"]
        for status in ("pending", "running")), timeout=180)
    stable = live.api("GET", f"deployments/{DEPLOYMENT}/").json()["current_revision"]
    wait_steady(live, revision=stable)
    trickle = Trickle(deployment)
    trickle.start()
    try:
        created = live.api("POST", f"deployments/{DEPLOYMENT}/revisions/", json={
            "engine_settings": {"threads": 1, "kv_cache_bytes": 12 << 20}, "comment": "the bad one"})
        assert created.status_code == 202, created.text
        bad, replacement = created.json()["revision"]["number"], created.json()["action"]
        live.wait_for("the bad revision's workers ready", lambda: {
            w["role"] for w in live.workers(DEPLOYMENT) if w["revision"] == bad and w["status"] == "ready"}
            == {"prefill", "decode"}, timeout=150)
        back = live.api("POST", f"deployments/{DEPLOYMENT}/rollback", json={"revision": stable})
        assert back.status_code == 202, back.text
        # Preempted, unless its old workers were already gone by then (a poll late by the drain grace on a loaded
        # host): the rollback goes in either way, and the API tests pin the preemption itself.
        if live.action(replacement["id"])["status"] != "succeeded":
            assert back.json()["action"]["params"]["preempted"]["action"] == replacement["id"]
            assert live.action(replacement["id"])["status"] == "failed"
        live.wait_for("the rollback to succeed", lambda: live.action(back.json()["action"]["id"])["status"]
                      == "succeeded", timeout=150)
        wait_steady(live, revision=stable)
        served = trickle.num_ok
        live.wait_for("a few more requests", lambda: trickle.num_ok >= served + 3, timeout=60)
    finally:
        trickle.stopped.set()
        trickle.join(60)
    assert trickle.failures == []
