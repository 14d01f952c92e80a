"""One shared gateway in front of two deployments, each by its model name (docs/gateway.md, "Shared gateway"): the
official openai client reaches both through one base URL; each deployment keeps its own tenants (a key of one gets 404
model_not_found on the other and lists only its model), admission queue (one full, the other serves), sampling
defaults, series and trace. A stand-in control plane answers the shared membership (docs/contracts.md); real gateway
and simulated worker processes."""
from __future__ import annotations

import hashlib
import re
import threading
import time

import openai
import pytest
import requests

from tests.inference.gateway.support import TOKEN, ControlPlane, start_gateway, stop_all
from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration

KEYS = {"alpha": "tk-alpha-0123456789", "beta": "tk-beta-01234567890"}  # each tenant may use one deployment


def _tenants(deployment: str) -> dict:
    """As the control plane lists them: every tenant with a key, `allowed` where it may use this deployment."""
    return {f"for-{name}": {"class": "standard", "limits": {}, "allowed": name == deployment,
                            "keys": [{"hash": hashlib.sha256(key.encode()).hexdigest(), "expires_at": None}]}
            for name, key in KEYS.items()}


def _answer(name: str, worker_url: str, **extra) -> dict:
    return {"deployment": name, "model": name, "mode": "colocated",
            "groups": [{"revision": 1, "prefill": [], "decode": [], "colocated": [worker_url]}],
            "requires_key": True, "tenants": _tenants(name), **extra}


def _worker(name: str, log_dir, *extra: str):
    port = free_port()
    proc = start(name, ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated", "--model",
                        "/models/sim-model", "--port", str(port), *extra], log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    return proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("shared-gateway")
    # alpha's worker runs one sequence at a time, and with no headroom that is alpha's one admission slot.
    alpha, beta = _worker("sim-alpha", log_dir, "--max-num-seqs", "1"), _worker("sim-beta", log_dir)
    control_plane = ControlPlane()
    control_plane.start()
    # alpha queues one request at most and never preempts: a second request waits for the first to end.
    answers = [_answer("alpha", alpha.url, admission={"max_queued": 1, "max_preemptions": 0},
                       sampling_defaults={"max_tokens": 5}),
               _answer("beta", beta.url)]
    control_plane.shared["deployments"] = answers
    procs = [alpha, beta]
    try:
        for worker in procs:
            wait_http(worker, worker.url + "/health", timeout=60)
        gateway = start_gateway("shared-gateway", ["--control-plane", control_plane.url, "--shared-gateway", "front",
                                                   "--token", TOKEN, "--membership-interval", "0.2",
                                                   "--worker-capacity-headroom", "0"], log_dir)
        procs.append(gateway)
        yield control_plane, gateway, answers
    finally:
        stop_all(procs)
        control_plane.stop()


def _client(gateway, deployment: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEYS[deployment], max_retries=0, timeout=60)


def _headers(deployment: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[deployment]}"}


def _metric(gateway, name: str, model: str) -> float:
    page = requests.get(gateway.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if re.match(rf'{name}{{[^}}]*model="{model}"', line))


def test_the_openai_client_reaches_both_models_through_one_base_url(fleet):
    _, gateway, _ = fleet
    for model in ("alpha", "beta"):
        client = _client(gateway, model)
        completion = client.completions.create(model=model, prompt="The license says", max_tokens=4,
                                               extra_body={"ignore_eos": True})
        assert completion.model == model and completion.usage.completion_tokens == 4
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                              max_tokens=3, extra_body={"ignore_eos": True})
        assert chat.model == model and chat.choices[0].message.role == "assistant"
        chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                     max_tokens=3, stream=True, extra_body={"ignore_eos": True}))
        assert {c.model for c in chunks} == {model} and chunks[-1].choices[0].finish_reason == "length"
        streamed = list(client.completions.create(model=model, prompt="Once", max_tokens=3, stream=True,
                                                  stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True}))
        assert streamed[-1].usage.completion_tokens == 3


def test_each_deployment_fills_in_its_own_sampling_defaults(fleet):
    _, gateway, _ = fleet
    # alpha's default max_tokens is 5; beta has none, so OpenAI's 16 of the legacy endpoint applies.
    for model, num_tokens in (("alpha", 5), ("beta", 16)):
        result = _client(gateway, model).completions.create(model=model, prompt="Count", extra_body={
            "ignore_eos": True})
        assert result.usage.completion_tokens == num_tokens


def test_a_key_of_one_deployment_is_model_not_found_on_the_other_and_lists_only_its_model(fleet):
    _, gateway, _ = fleet
    for mine, other in (("alpha", "beta"), ("beta", "alpha")):
        client = _client(gateway, mine)
        assert [m.id for m in client.models.list()] == [mine]
        with pytest.raises(openai.NotFoundError) as refused:
            client.completions.create(model=other, prompt="hello", max_tokens=2)
        assert refused.value.code == "model_not_found" and refused.value.param == "model"
    with pytest.raises(openai.NotFoundError) as unknown:
        _client(gateway, "alpha").completions.create(model="gamma", prompt="hello", max_tokens=2)
    assert unknown.value.code == "model_not_found"
    stranger = openai.OpenAI(base_url=gateway.url + "/v1", api_key="tk-nobody-000000000", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as rejected:
        stranger.completions.create(model="alpha", prompt="hello", max_tokens=2)
    assert rejected.value.code == "invalid_api_key"
    assert requests.get(gateway.url + "/v1/models", timeout=10).status_code == 401


def test_a_full_admission_queue_of_one_deployment_leaves_the_other_serving(fleet):
    _, gateway, _ = fleet
    url = gateway.url + "/v1/completions"
    # alpha's one slot: a long stream, held open.
    holder = requests.post(url, headers=_headers("alpha"), stream=True, timeout=60, json={
        "model": "alpha", "prompt": "go", "max_tokens": 2000, "ignore_eos": True, "stream": True})
    try:
        assert holder.status_code == 200
        lines = holder.iter_lines()  # kept: a dropped iterator closes the connection, which ends the stream
        next(lines)  # its first token: it runs
        waiting: list[requests.Response] = []
        waiter = threading.Thread(target=lambda: waiting.append(requests.post(url, headers=_headers("alpha"),
                                                                              timeout=60, json={
            "model": "alpha", "prompt": "next", "max_tokens": 2})))
        waiter.start()
        deadline = time.monotonic() + 15
        while _metric(gateway, "tandem_gateway_queue_length", "alpha") < 1:
            assert time.monotonic() < deadline, "the second alpha request never queued"
            time.sleep(0.05)
        full = requests.post(url, headers=_headers("alpha"), timeout=10,
                             json={"model": "alpha", "prompt": "one more", "max_tokens": 2})
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert _metric(gateway, "tandem_gateway_queue_length", "beta") == 0
        served = requests.post(url, headers=_headers("beta"), timeout=10,
                               json={"model": "beta", "prompt": "meanwhile", "max_tokens": 2})
        assert served.status_code == 200, served.text
    finally:
        holder.close()  # the stream's end frees alpha's slot for the waiting request
    waiter.join(30)
    assert waiting and waiting[0].status_code == 200, waiting and waiting[0].text
    assert _metric(gateway, "tandem_gateway_queue_shed_total", "alpha") >= 1
    assert _metric(gateway, "tandem_gateway_queue_shed_total", "beta") == 0


def test_metrics_health_and_trace_are_per_deployment(fleet):
    _, gateway, _ = fleet
    for model in ("alpha", "beta"):
        assert _metric(gateway, "tandem_request_success_total", model) >= 1
        assert _metric(gateway, "tandem_gateway_worker_up", model) == 1
        assert _metric(gateway, "tandem_gateway_tenant_requests_total", model) >= 1
    assert _metric(gateway, "tandem_gateway_admission_capacity", "alpha") == 1
    page = requests.get(gateway.url + "/metrics", timeout=10).text
    assert page.count("# TYPE tandem_request_success_total counter") == 1  # one family, each deployment's samples
    assert 'tandem_request_errors_total{kind="invalid_api_key",model="",revision="",role="gateway"}' in page
    # One deployment's page (what Prometheus scrapes for its target): its series alone, not the process's own.
    own = requests.get(gateway.url + "/metrics", params={"deployment": "alpha"}, timeout=10).text
    assert set(re.findall(r'model="([^"]*)"', own)) == {"alpha"} and "process_cpu_seconds_total" not in own
    assert 'tandem_gateway_tenant_requests_total{' in own
    unknown = requests.get(gateway.url + "/metrics", params={"deployment": "gamma"}, timeout=10)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "deployment"
    health = requests.get(gateway.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and set(health["deployments"]) == {"alpha", "beta"}
    assert health["deployments"]["beta"]["revision"] == 1
    trace = requests.get(gateway.url + "/trace", params={"deployment": "beta"}, timeout=10).json()
    assert trace["deployment"] == "beta" and trace["records"]
    assert {r["deployment"] for r in trace["records"]} == {"beta"}
    refused = requests.get(gateway.url + "/trace", timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "deployment"


def test_a_deployment_detached_from_the_gateway_is_not_found_until_attached_again(fleet):
    control_plane, gateway, answers = fleet
    client = _client(gateway, "beta")
    control_plane.shared["deployments"] = answers[:1]
    try:
        control_plane.wait_polls(2)
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="beta", prompt="still there?", max_tokens=2)
        health = requests.get(gateway.url + "/health", timeout=10).json()
        assert set(health["deployments"]) == {"alpha"}
    finally:
        control_plane.shared["deployments"] = answers
    control_plane.wait_polls(2)
    deadline = time.monotonic() + 15  # attached anew: its workers probed before it takes requests
    while True:
        try:
            assert client.completions.create(model="beta", prompt="back", max_tokens=2).usage.completion_tokens == 2
            break
        except (openai.NotFoundError, openai.InternalServerError):
            assert time.monotonic() < deadline
            time.sleep(0.1)
