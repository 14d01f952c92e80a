"""A gateway whose deployment requires a key (docs/contracts.md, "Tenants"), in front of a real tiny-model worker,
polling a stand-in control plane: missing, unknown, revoked and expired keys get OpenAI-shaped 401s, a key of a
tenant that may not use the deployment 404 model_not_found, a tenant over a limit 429 with Retry-After; a key
revoked at the control plane stops working within one poll, and the last known keys stay enforced while the
control plane is away. The official openai client works with api_key=."""
from __future__ import annotations

import hashlib
import os
import signal
import time

import openai
import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, TOKEN, ControlPlane, shared_workers, start_gateway
from tests.inference.worker.support import metric

pytestmark = pytest.mark.integration

KEYS = {"acme": "tk-acme-0123456789", "slow": "tk-slow-0123456789", "tiny": "tk-tiny-0123456789",
        "solo": "tk-solo-0123456789", "other": "tk-other-012345678", "gone": "tk-gone-0123456789",
        "old": "tk-old-01234567890", "sdk": "tk-sdk-01234567890"}


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _tenants(revoked: tuple[str, ...] = ()) -> dict:
    def tenant(name: str, limits: dict | None = None, allowed: bool = True, expires_at: float | None = None):
        return {"class": "standard", "limits": limits or {}, "allowed": allowed,
                "keys": [] if name in revoked else [{"hash": _hash(KEYS[name]), "expires_at": expires_at}]}

    return {"acme": tenant("acme"), "slow": tenant("slow", {"requests_per_minute": 2}),
            "tiny": tenant("tiny", {"tokens_per_minute": 30}), "solo": tenant("solo", {"max_concurrent_requests": 1}),
            "other": tenant("other", allowed=False), "gone": tenant("gone"),
            "old": tenant("old", expires_at=time.time() - 1), "sdk": tenant("sdk", {"max_tokens": 4})}


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    worker = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)["colocated"]
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints.update({"groups": [{"revision": 1, "prefill": [], "decode": [],
                                                "colocated": [worker.url]}],
                                    "requires_key": True, "tenants": _tenants()})
    gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                        "--token", TOKEN, "--membership-interval", "0.2"],
                            tmp_path_factory.mktemp("gateway-tenants"))
    gateway.extra["worker"] = worker
    yield control_plane, gateway
    gateway.stop()
    control_plane.stop()


def _complete(gateway, key: str | None, timeout: float = 60, **body) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(gateway.url + "/v1/completions", headers=headers, timeout=timeout,
                         json={"model": "demo", "prompt": "hello", "max_tokens": 3, **body})


def _error(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_valid_key_is_served_and_no_key_or_an_unknown_one_is_a_401(fleet):
    _, gateway = fleet
    assert _complete(gateway, KEYS["acme"]).status_code == 200
    missing = _complete(gateway, None)
    assert _error(missing, 401)["code"] == "missing_api_key"
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    unknown = _error(_complete(gateway, "tk-guessed-000000000"), 401)
    assert unknown["code"] == "invalid_api_key" and unknown["type"] == "invalid_request_error"
    assert "tk-gue" in unknown["message"] and "tk-guessed-000000000" not in unknown["message"]
    assert _error(_complete(gateway, KEYS["old"]), 401)["message"].endswith("has expired.")
    assert requests.get(gateway.url + "/v1/models", timeout=10).status_code == 401
    listed = requests.get(gateway.url + "/v1/models", headers={"Authorization": f"Bearer {KEYS['acme']}"},
                          timeout=10)
    assert [m["id"] for m in listed.json()["data"]] == ["demo"]


def test_a_key_with_bytes_that_are_not_utf8_is_a_401_not_a_server_error(fleet):
    _, gateway = fleet
    response = requests.post(gateway.url + "/v1/completions", headers={"Authorization": b"Bearer tk-\xff\xfe-key"},
                             json={"model": "demo", "prompt": "hello", "max_tokens": 3}, timeout=30)
    error = _error(response, 401)
    assert error["code"] == "invalid_api_key" and "tk-\\udcff" in error["message"]


def test_a_key_of_a_tenant_that_may_not_use_the_deployment_is_model_not_found(fleet):
    _, gateway = fleet
    error = _error(_complete(gateway, KEYS["other"]), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_a_tenant_over_its_requests_per_minute_gets_a_429_naming_the_limit(fleet):
    _, gateway = fleet
    assert [_complete(gateway, KEYS["slow"]).status_code for _ in range(2)] == [200, 200]
    refused = _complete(gateway, KEYS["slow"])
    error = _error(refused, 429)
    assert error["type"] == "rate_limit_error" and error["param"] == "requests_per_minute"
    assert 1 <= int(refused.headers["Retry-After"]) <= 30


def test_tokens_per_minute_counts_the_real_usage_of_finished_requests(fleet):
    _, gateway = fleet
    served = _complete(gateway, KEYS["tiny"], prompt="one two three four five six seven", max_tokens=30,
                       ignore_eos=True)
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["total_tokens"] > 30  # over the minute's 30 tokens: the bucket is in debt
    error = _error(_complete(gateway, KEYS["tiny"]), 429)
    assert error["param"] == "tokens_per_minute"


def test_a_tenant_at_its_concurrency_limit_gets_a_429_until_its_request_ends(fleet):
    _, gateway = fleet
    worker = gateway.extra["worker"]
    for _ in range(3):  # a stream that ended before the worker was stopped (a busy host) is tried again
        with requests.post(gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {KEYS['solo']}"},
                           json={"model": "demo", "prompt": "count", "max_tokens": 480, "ignore_eos": True,
                                 "stream": True}, stream=True, timeout=120) as running:
            assert running.status_code == 200
            next(running.iter_lines())  # the first chunk: the request is in flight
            # Held in flight by the OS (SIGSTOP), however fast the worker would finish it, once the gateway still
            # counts it: then the check is not a race.
            os.kill(worker.popen.pid, signal.SIGSTOP)
            try:
                in_flight = metric(gateway.url, "tandem_gateway_tenant_requests_running", tenant="solo")
                if in_flight:
                    error = _error(_complete(gateway, KEYS["solo"], timeout=30), 429)
            finally:
                os.kill(worker.popen.pid, signal.SIGCONT)
            for _ in running.iter_lines():
                pass
        if in_flight:
            break
    assert in_flight == 1, "the stream ended before the worker could be stopped, three times"
    assert error["param"] == "max_concurrent_requests"
    assert _complete(gateway, KEYS["acme"]).status_code == 200  # other tenants are not held up
    # The gateway releases the slot when its handler ends, a moment after the client read [DONE].
    deadline = time.monotonic() + 30
    while (status := _complete(gateway, KEYS["solo"]).status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 200


def test_a_key_revoked_at_the_control_plane_stops_working_within_one_poll(fleet):
    control_plane, gateway = fleet
    assert _complete(gateway, KEYS["gone"]).status_code == 200
    control_plane.endpoints["tenants"] = _tenants(revoked=("gone",))
    control_plane.wait_polls(2)  # the poll in flight may carry the old answer; the next one has the new
    assert _error(_complete(gateway, KEYS["gone"]), 401)["code"] == "invalid_api_key"
    assert _complete(gateway, KEYS["acme"]).status_code == 200


def test_the_last_known_keys_stay_enforced_while_the_control_plane_is_away(fleet):
    control_plane, gateway = fleet
    control_plane.down = True
    try:
        control_plane.wait_polls(2)
        assert _complete(gateway, KEYS["acme"]).status_code == 200
        assert _error(_complete(gateway, None), 401)["code"] == "missing_api_key"
        assert _error(_complete(gateway, KEYS["other"]), 404)["code"] == "model_not_found"
    finally:
        control_plane.down = False


def test_a_malformed_tenant_answer_keeps_the_last_good_one(fleet):
    control_plane, gateway = fleet
    good = control_plane.endpoints["tenants"]
    control_plane.endpoints["tenants"] = {**good, "acme": {**good["acme"], "class": "urgent"}}
    try:
        control_plane.wait_polls(2)
        assert _complete(gateway, KEYS["acme"]).status_code == 200
        assert _complete(gateway, None).status_code == 401
    finally:
        control_plane.endpoints["tenants"] = good


def test_the_openai_client_sends_its_api_key_and_reads_the_errors(fleet):
    _, gateway = fleet
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEYS["sdk"], max_retries=0, timeout=60)
    result = client.completions.create(model="demo", prompt="The license says", temperature=0,
                                       extra_body={"ignore_eos": True})
    assert result.usage.completion_tokens == 4  # the tenant's max_tokens cap fills in the default
    chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model="demo", prompt="x", max_tokens=5)
    assert "max_tokens limit (4)" in str(too_many.value)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="tk-wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEYS["other"], max_retries=0).completions.create(
            model="demo", prompt="x", max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        slow = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEYS["slow"], max_retries=0)
        for _ in range(3):
            slow.completions.create(model="demo", prompt="x", max_tokens=1)


def test_the_tenant_series_name_only_the_tenants_of_the_membership(fleet):
    _, gateway = fleet
    assert _complete(gateway, KEYS["acme"]).status_code == 200
    text = requests.get(gateway.url + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("tandem_gateway_tenant_")]
    requests_acme = [line for line in lines if line.startswith("tandem_gateway_tenant_requests_total{")
                     and 'tenant="acme"' in line]
    assert requests_acme and float(requests_acme[0].rsplit(" ", 1)[1]) >= 1
    assert any('tenant="acme"' in line and 'kind="completion"' in line for line in lines)
    assert any(line.startswith("tandem_gateway_tenant_rate_limited_total{") and 'tenant="slow"' in line
               and 'limit="requests_per_minute"' in line and float(line.rsplit(" ", 1)[1]) >= 1 for line in lines)
    tenants = {part.split('"')[1] for line in lines for part in line.split(",") if part.startswith("tenant=")}
    assert tenants <= set(KEYS) and "acme" in tenants


def _sample(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_each_tenant_has_its_own_time_to_first_token_histogram_and_its_limits_on_metrics(fleet):
    _, gateway = fleet
    ttft = "tandem_gateway_tenant_time_to_first_token_seconds_count"
    before = requests.get(gateway.url + "/metrics", timeout=10).text
    assert _complete(gateway, KEYS["acme"]).status_code == 200
    after = requests.get(gateway.url + "/metrics", timeout=10).text
    assert _sample(after, ttft, tenant="acme") == (_sample(before, ttft, tenant="acme") or 0) + 1
    # A tenant that may not use the deployment never got a first token: its histogram is there, empty.
    assert _sample(after, ttft, tenant="other") == 0
    assert _sample(after, "tandem_gateway_tenant_time_to_first_token_seconds_bucket", tenant="acme", le="+Inf") \
        == _sample(after, ttft, tenant="acme")
    assert _sample(after, "tandem_gateway_tenant_limit", tenant="slow", limit="requests_per_minute") == 2
    assert _sample(after, "tandem_gateway_tenant_limit", tenant="tiny", limit="tokens_per_minute") == 30
    # No limit, no series (max_tokens caps one request and is not metered).
    assert _sample(after, "tandem_gateway_tenant_limit", tenant="acme") is None
    assert _sample(after, "tandem_gateway_tenant_limit", tenant="sdk") is None
