"""Scaling a pool through the API starts and drains real workers; the scale actions finish."""
from __future__ import annotations

import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = [pytest.mark.integration, pytest.mark.backends]


def _scale(live, replicas: int) -> dict:
    response = live.api("POST", f"deployments/{DEPLOYMENT}/scale", json={"role": "decode", "replicas": replicas})
    assert response.status_code == 202, response.text
    return response.json()["action"]


def test_scaling_decode_up_to_two_and_back_to_one(live, deployment):
    before = {w["id"] for w in wait_steady(live) if w["role"] == "decode"}

    up = _scale(live, 2)
    ready = wait_steady(live, decode=2)
    decode_ids = {w["id"] for w in ready if w["role"] == "decode"}
    assert before < decode_ids  # the old worker kept serving; one was added
    live.wait_for("the scale-up action to succeed", lambda: live.action(up["id"])["status"] == "succeeded")
    endpoints = live.api("GET", f"deployments/{DEPLOYMENT}/endpoints").json()
    assert len(endpoints["groups"][0]["decode"]) == 2

    down = _scale(live, 1)
    ready = wait_steady(live, decode=1)
    assert {w["id"] for w in ready if w["role"] == "decode"} == before  # the newest one was drained
    live.wait_for("the scale-down action to succeed", lambda: live.action(down["id"])["status"] == "succeeded")
    added, = decode_ids - before
    assert live.api("GET", f"workers/{added}/").json()["status"] == "stopped"
    assert completion(deployment).status_code == 200
