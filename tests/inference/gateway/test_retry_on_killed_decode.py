"""A decode worker killed with SIGKILL fails the KV handoff; the gateway retries the request on the other decode
worker before its first token, and the client never sees the failure."""
from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.gateway.support import PLAIN_FLEET, complete, shared_workers, start_gateway, start_workers, \
    stop_all

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    shared = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-retry")
    # decode-a is this module's own: the test kills it.
    (decode_a,) = start_workers([("decode-a", "decode")], tiny_model_dir, log_dir)
    decode_b = shared["decode"]
    # Probes every 60 s: the only way the gateway can learn that decode-a died is the failed request itself.
    gateway = start_gateway("gateway", ["--prefill", shared["prefill"].url,
                                        "--decode", f"{decode_a.url},{decode_b.url}", "--health-interval", "60"],
                            log_dir)
    yield gateway, decode_a, decode_b
    stop_all([gateway, decode_a])


def _retries(gateway_url: str) -> dict[str, float]:
    text = requests.get(gateway_url + "/metrics", timeout=5).text
    return {s.labels["kind"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "tandem_gateway_retries" for s in f.samples if s.name.endswith("_total")}


def test_a_request_whose_decode_worker_was_killed_succeeds_on_the_other(fleet):
    gateway, decode_a, decode_b = fleet
    body = {"model": "tandem", "prompt": "Permission is hereby granted", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}
    before = complete(gateway.url, body)
    assert before.status_code == 200, before.text
    decode_a.kill9()
    # Least-outstanding with ties to the worker picked longest ago: two requests in a row reach both decode
    # workers, so one of them is sent to the dead one.
    answers = [complete(gateway.url, body) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert all(a.json()["choices"][0]["text"] == before.json()["choices"][0]["text"] for a in answers)
    assert _retries(gateway.url).get("kv_transfer", 0) >= 1
    health = requests.get(gateway.url + "/health", timeout=5).json()
    decode_states = {w["url"]: w["state"] for w in health["groups"][0]["decode"]}
    assert decode_states == {decode_a.url: "down", decode_b.url: "ready"}
