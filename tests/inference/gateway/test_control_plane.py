"""With --control-plane, the gateway polls the deployment's endpoints (docs/contracts.md) with its token, serves
the newest complete revision, and keeps the last good membership while the control plane is unreachable.

The control plane here is a small aiohttp server started by the test: a real HTTP peer speaking the documented
contract, whose answers the test changes between polls."""
from __future__ import annotations

import time

import pytest
import requests

from tests.inference.gateway.support import (PLAIN_FLEET, TOKEN, ControlPlane, complete, shared_workers,
                                             start_gateway)
from tests.procs import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    worker = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)["colocated"]
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints["groups"] = [{"revision": 2, "prefill": [], "decode": [], "colocated": [worker.url]}]
    gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                        "--token", TOKEN, "--membership-interval", "0.2"],
                            tmp_path_factory.mktemp("gateway-control-plane"))
    yield control_plane, gateway, worker
    gateway.stop()
    control_plane.stop()


def _health(gateway) -> dict:
    return requests.get(gateway.url + "/health", timeout=5).json()


def test_it_serves_the_workers_the_control_plane_lists_under_the_deployment_name(fleet):
    control_plane, gateway, _ = fleet
    assert control_plane.authorizations == {f"Token {TOKEN}"}
    resp = complete(gateway.url, {"model": "demo", "prompt": "hello", "max_tokens": 3})
    assert resp.status_code == 200, resp.text
    assert _health(gateway)["revision"] == 2


def test_it_prefers_the_newest_revision_only_once_that_one_is_ready(fleet):
    control_plane, gateway, worker = fleet
    not_started = f"http://127.0.0.1:{free_port()}"
    control_plane.endpoints["groups"] = [
        {"revision": 3, "prefill": [], "decode": [], "colocated": [not_started]},
        {"revision": 2, "prefill": [], "decode": [], "colocated": [worker.url]}]
    control_plane.wait_polls(2)
    health = _health(gateway)
    assert [g["revision"] for g in health["groups"]] == [3, 2]
    assert health["revision"] == 2
    control_plane.endpoints["groups"] = [{"revision": 3, "prefill": [], "decode": [], "colocated": [worker.url]}]
    control_plane.wait_polls(2)
    deadline = time.monotonic() + 30  # a membership poll, then a health probe, on a loaded host
    while _health(gateway).get("revision") != 3:
        assert time.monotonic() < deadline, _health(gateway)
        time.sleep(0.05)


def test_it_keeps_the_last_good_membership_while_the_control_plane_is_down(fleet):
    control_plane, gateway, _ = fleet
    control_plane.down = True
    try:
        control_plane.wait_polls(2)
        assert _health(gateway)["status"] == "ok"
        assert complete(gateway.url, {"model": "demo", "prompt": "still here", "max_tokens": 2}).status_code == 200
    finally:
        control_plane.down = False


def test_a_malformed_answer_does_not_wipe_the_membership(fleet):
    control_plane, gateway, worker = fleet
    good = control_plane.endpoints
    control_plane.endpoints = {"deployment": "demo", "mode": "colocated", "groups": "nope"}
    try:
        control_plane.wait_polls(2)
        assert _health(gateway)["status"] == "ok"
    finally:
        control_plane.endpoints = good


def test_a_gateway_that_starts_in_front_of_a_serving_fleet_answers_its_first_request(fleet, tmp_path):
    """It polls the control plane and probes the workers before it listens: no 503 "no membership yet" between
    a (re)start and its first poll, however slowly the control plane answers."""
    control_plane, _, _ = fleet
    control_plane.delay_s = 2.0
    try:
        gateway = start_gateway("gateway-fresh", ["--control-plane", control_plane.url, "--deployment", "demo",
                                                  "--token", TOKEN, "--membership-interval", "5"],
                                tmp_path, wait_ready=False)  # returns as soon as the port answers at all
    finally:
        control_plane.delay_s = 0.0
    try:
        resp = complete(gateway.url, {"model": "demo", "prompt": "first", "max_tokens": 2})
        assert resp.status_code == 200, resp.text
    finally:
        gateway.stop()


def test_it_keeps_serving_when_the_control_plane_process_is_gone(fleet):
    control_plane, gateway, _ = fleet
    num_polls = control_plane.num_polls
    control_plane.stop()
    time.sleep(1.0)  # several poll intervals (0.2 s) against a closed port
    assert control_plane.num_polls == num_polls
    assert _health(gateway)["status"] == "ok"
    assert complete(gateway.url, {"model": "demo", "prompt": "anyone?", "max_tokens": 2}).status_code == 200
