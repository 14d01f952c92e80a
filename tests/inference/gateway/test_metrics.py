"""The gateway's /metrics is Prometheus text with the client-side latencies, token counts and errors,
labelled role="gateway" and, per request, revision (here "": a static gateway's group has no revision)."""
from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.gateway.support import PLAIN_FLEET, complete, shared_workers, sse_events, start_gateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gateway_url(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    gateway = start_gateway("gateway", ["--colocated", workers["colocated"].url, "--served-model-name", "tiny"],
                            tmp_path_factory.mktemp("gateway-metrics"))
    yield gateway.url
    gateway.stop()


def _samples(url: str) -> dict[tuple, float]:
    resp = requests.get(url + "/metrics", timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted({"role": "gateway", "model": "tiny", "revision": "", **labels}.items())))
    return samples.get(key, 0.0)


def test_it_exposes_the_documented_gateway_series(gateway_url):
    body = {"model": "tiny", "prompt": "Hello world", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    usage = complete(gateway_url, body).json()["usage"]
    assert sse_events(complete(gateway_url, {**body, "stream": True}))[-1] == "[DONE]"
    assert complete(gateway_url, {**body, "model": "other"}).status_code == 404
    samples = _samples(gateway_url)
    names = {name for name, _ in samples}
    for family in ("tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
                   "tandem_e2e_request_latency_seconds"):
        assert {f"{family}_bucket", f"{family}_count", f"{family}_sum"} <= names
    assert _value(samples, "tandem_time_to_first_token_seconds_count") == 2
    assert _value(samples, "tandem_e2e_request_latency_seconds_count") == 2
    assert _value(samples, "tandem_inter_token_latency_seconds_count") == 2 * 4
    assert _value(samples, "tandem_prompt_tokens_total") == 2 * usage["prompt_tokens"]
    assert _value(samples, "tandem_generation_tokens_total") == 2 * 5
    assert _value(samples, "tandem_request_success_total", finished_reason="length") == 2
    assert _value(samples, "tandem_request_errors_total", kind="model_not_found") == 1
    assert any(name == "tandem_gateway_worker_up" and value == 1 for (name, _), value in samples.items())
