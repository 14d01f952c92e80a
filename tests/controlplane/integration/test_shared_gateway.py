"""A shared gateway under the real stack: created and attached through the API, its process started by the node
agent, the official openai client with one base URL answered by both models (simulated workers), and each
deployment's requests pulled into its own recorded trace, and the process scraped once per deployment: each has the
gateway's series stored under its own name."""
from __future__ import annotations

import openai
import pytest

from tests.procs import free_port

pytestmark = pytest.mark.integration

MODELS = ("sg-chat", "sg-code")


@pytest.fixture
def shared(live, tiny_model_dir):
    port = free_port()
    for name in MODELS:
        response = live.api("POST", "deployments/", json={
            "name": name, "mode": "colocated", "model_path": str(tiny_model_dir),
            "engine_settings": {"simulate": "tiny-cpu"}, "replicas": {"colocated": 1}, "gateway_port": free_port()})
        assert response.status_code == 202, response.text
    assert live.api("POST", "gateways/", json={"name": "sg-front", "port": port}).status_code == 201
    for name in MODELS:
        response = live.api("PUT", f"deployments/{name}/gateway", json={"shared_gateway": "sg-front"})
        assert response.status_code == 200, response.text
    yield f"http://127.0.0.1:{port}"
    for name in MODELS:
        live.api("DELETE", f"deployments/{name}/gateway")
        live.api("DELETE", f"deployments/{name}/")
    # With nothing attached its process drains; the gateway is deleted once it has, leaving the session's stack as
    # it was for the tests after this one.
    live.wait_for("the shared gateway deleted once its process stopped",
                  lambda: live.api("DELETE", "gateways/sg-front/").status_code in (204, 404), timeout=90, interval=1)


def _answers(client, model: str) -> bool:
    try:
        return bool(client.completions.create(model=model, prompt="one two", max_tokens=3).choices[0].text)
    except openai.APIError:
        return False


def test_one_base_url_serves_both_models_and_each_trace_is_its_own(live, shared):
    client = openai.OpenAI(base_url=f"{shared}/v1", api_key="unused", max_retries=0, timeout=10)
    live.wait_for("the shared gateway to answer both models",
                  lambda: all(_answers(client, model) for model in MODELS), timeout=90, interval=0.5)

    def one_ready_process():
        # A process started before the second deployment's key was there is restarted in place: wait for the end.
        rows = [w for w in live.api("GET", "workers/", params={"shared_gateway": "sg-front"}).json()
                if w["status"] != "stopped"]
        return rows if [(w["role"], w["status"], w["deployment"]) for w in rows] == [("gateway", "ready", None)] \
            else None

    processes = live.wait_for("one ready shared gateway process", one_ready_process, timeout=60, interval=0.5)
    assert sorted(m.id for m in client.models.list()) == sorted(MODELS)

    def traced(name: str) -> int:
        traces = live.api("GET", f"deployments/{name}/traces/").json()
        return next((t["requests"] for t in traces if t["name"] == "recorded"), 0)

    live.wait_for("each deployment's requests in its own recorded trace",
                  lambda: all(traced(name) >= 1 for name in MODELS), timeout=45, interval=1)

    def gateway_series(name: str) -> list[dict]:
        body = live.api("GET", "metrics/query", params={"metric": "qps", "deployment": name, "role": "gateway",
                                                        "worker": str(processes[0]["id"]), "step": 1}).json()
        return [item for item in body["series"] if item["points"]]

    # qps is a rate: stored from a deployment's second scrape of the process on, so both were scraped apart.
    live.wait_for("each deployment's gateway series stored from the shared process",
                  lambda: all(gateway_series(name) for name in MODELS), timeout=30, interval=1)
