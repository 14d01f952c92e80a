"""A tenant's minute of usage survives a gateway restart with --quota-state: the gate's bucket levels are saved and
the next process starts from them, refilled for the time it was away, under the current limits. A missing or
malformed file is a fresh minute. Hand-driven clocks first, then a real gateway stopped and started again."""
from __future__ import annotations

import hashlib
import json

import pytest
import requests

from inference.gateway import quota_state
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy
from tests.inference.gateway.support import TOKEN, ControlPlane, restart, start_gateway, stop_all
from tests.inference.gateway.test_tenant_limits import FinishedStream
from tests.procs import free_port, start, wait_http

KEY = "tk-acme-key-0123456"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _tenants(limits: dict) -> dict:
    return {"requires_key": True, "tenants": {"acme": {
        "class": "standard", "limits": limits, "allowed": True,
        "keys": [{"hash": hashlib.sha256(KEY.encode()).hexdigest(), "expires_at": None}]}}}


def _gate(limits: dict, wall: Clock) -> TenantGate:
    policy = parse_tenancy(_tenants(limits))
    return TenantGate(lambda: policy, clock=Clock(500.0), wall=wall)


def _spend(gate: TenantGate, num: int, tokens_each: int) -> None:
    for _ in range(num):
        ticket = gate.admit(gate.identify(f"Bearer {KEY}", "demo"), {}, {"max_tokens": 4})
        ticket.stream = FinishedStream(tokens_each, 0)
        ticket.release()


def _levels(gate: TenantGate) -> tuple[float, float]:
    state = gate.states["acme"]
    return state.buckets["requests"].level, state.buckets["tokens"].level


def test_a_restarted_gate_starts_from_the_saved_minute_refilled_for_the_time_away(tmp_path):
    path = tmp_path / "quota.json"
    wall = Clock(10_000.0)
    before = _gate({"requests_per_minute": 10, "tokens_per_minute": 600}, wall)
    _spend(before, 4, 100)  # 4 of 10 requests, 400 of 600 tokens
    quota_state.save(before, path, wall=wall.now)

    wall.now += 6.0  # away 6 s: 1 request and 60 tokens refill
    after = _gate({"requests_per_minute": 10, "tokens_per_minute": 600}, wall)
    quota_state.load(after, path, wall=wall.now)
    after.identify(f"Bearer {KEY}", "demo")
    assert _levels(after) == pytest.approx((7.0, 260.0))  # a fresh gate would hold (10, 600)


def test_a_changed_limit_keeps_what_was_spent_and_a_tenant_not_named_yet_keeps_its_levels(tmp_path):
    path = tmp_path / "quota.json"
    wall = Clock(10_000.0)
    before = _gate({"requests_per_minute": 10, "tokens_per_minute": 600}, wall)
    _spend(before, 4, 100)
    quota_state.save(before, path, wall=wall.now)
    # The next process meets a control plane that is away: it knows no tenant, yet saves acme's levels on.
    away = TenantGate(lambda: parse_tenancy({}), clock=Clock(0.0), wall=wall)
    quota_state.load(away, path, wall=wall.now)
    quota_state.save(away, path, wall=wall.now)
    later = _gate({"requests_per_minute": 20, "tokens_per_minute": 600}, wall)
    quota_state.load(later, path, wall=wall.now)
    later.identify(f"Bearer {KEY}", "demo")
    assert _levels(later) == pytest.approx((16.0, 200.0))  # 4 of 20 requests spent


@pytest.mark.parametrize("text", ["not json", "[]", '{"saved_at": "x", "tenants": {}}',
                                  '{"saved_at": 1, "tenants": {"acme": {"requests": [0, 1]}}}'])
def test_a_malformed_file_is_a_fresh_minute(tmp_path, text, caplog):
    path = tmp_path / "quota.json"
    path.write_text(text)
    gate = _gate({"requests_per_minute": 10, "tokens_per_minute": 600}, Clock(10_000.0))
    quota_state.load(gate, path)
    gate.identify(f"Bearer {KEY}", "demo")
    assert _levels(gate) == (10.0, 600.0)
    assert "quota state" in caplog.text


def test_the_flag(tmp_path):
    from inference.gateway.config import parse_args

    base = ["--port", "8080", "--colocated", "http://127.0.0.1:9000"]
    assert parse_args(base).quota_state is None
    assert parse_args([*base, "--quota-state", str(tmp_path / "q.json")]).quota_state == tmp_path / "q.json"


@pytest.mark.integration
def test_a_tenant_over_its_requests_per_minute_stays_over_it_after_a_restart(tmp_path):
    port = free_port()
    worker = start("sim-colocated", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated",
                                     "--model", "/models/sim-model", "--port", str(port)], tmp_path)
    control_plane = ControlPlane()
    procs = [worker]
    try:
        worker_url = f"http://127.0.0.1:{port}"
        wait_http(worker, worker_url + "/health", timeout=60)
        control_plane.start()
        control_plane.endpoints.update({
            "groups": [{"revision": 1, "prefill": [], "decode": [], "colocated": [worker_url]}],
            **_tenants({"requests_per_minute": 3})})
        path = tmp_path / "quota.json"
        gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo", "--token",
                                            TOKEN, "--quota-state", str(path)], tmp_path)
        procs.insert(0, gateway)

        def complete() -> requests.Response:
            return requests.post(gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                                 json={"model": "demo", "prompt": "one two", "max_tokens": 2}, timeout=60)

        assert [complete().status_code for _ in range(3)] == [200, 200, 200]
        assert complete().status_code == 429
        gateway = procs[0] = restart(gateway)  # SIGTERM, then the same command line
        refused = complete()
        assert refused.status_code == 429, "the restarted gateway gave the tenant a fresh minute"
        assert refused.json()["error"]["param"] == "requests_per_minute"
        assert json.loads(path.read_text())["tenants"]["acme"]["requests"][0] == 3
    finally:
        stop_all(procs)
        control_plane.stop()
