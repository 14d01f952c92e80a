"""vLLM workers under Tandem, end to end: a colocated deployment whose revision names engine vllm, started by the node
agent from the project's vLLM environment (`make vllm`), served through Tandem's gateway to the official openai
client and scraped into Tandem's series; an alert rule on the pool's TTFT P99 scales it to two; a worker killed
mid-stream, whose stream goes on token for token on the other; a chaos pause whose hypothesis holds; a scale-down
under streaming load that fails no request. Its own deployment (vLLM workers on the tiny model, eager: no compile
warm-up) leaves `it-demo` alone; the tests run in this order, each leaving what the next one needs."""
from __future__ import annotations

import os
import signal
import threading

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from controlplane.settings_fleet import TANDEM_VLLM_PYTHON
from inference.engines.vllm import environment
from tests.procs import free_port

pytestmark = [pytest.mark.integration]
if not TANDEM_VLLM_PYTHON:
    pytestmark.append(pytest.mark.skip(reason="no vLLM environment here (`make vllm` builds .venv-vllm)"))

NAME = "it-vllm"
PROMPT = "The quick brown fox"
NUM_TOKENS = 900  # with ignore_eos: seconds of streaming even on a quiet machine
VLLM_SETTINGS = {"engine": "vllm", "threads": 1, "compile": False, "kv_cache_bytes": 1 << 30, "max_num_seqs": 8,
                 "max_model_len": 1024}


@pytest.fixture(scope="module")
def vllm_gateway(live, tiny_model_dir):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "colocated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": VLLM_SETTINGS, "replicas": {"colocated": 1}, "max_replicas": {"colocated": 2},
        "gateway_port": gateway_port})
    assert created.status_code == 202, created.text
    gateway = f"http://127.0.0.1:{gateway_port}"
    try:
        _ready(live, 1)
        live.wait_for("the gateway to answer", lambda: requests.post(f"{gateway}/v1/completions", timeout=30, json={
            "model": NAME, "prompt": "Hi", "max_tokens": 2}).status_code == 200, timeout=60, interval=0.5)
        yield gateway
    finally:
        live.api("DELETE", f"deployments/{NAME}/")


def _ready(live, count: int, timeout: float = 400) -> list[dict]:
    """Until exactly `count` vLLM workers are ready and none starts or drains."""
    def settled():
        workers = [w for w in live.workers(NAME, role="colocated")
                   if w["status"] in ("pending", "starting", "ready", "draining")]
        ready = [w for w in workers if w["status"] == "ready"]
        return ready if len(ready) == len(workers) == count else None
    return live.wait_for(f"{count} ready vLLM worker(s)", settled, timeout=timeout, interval=1)


class StreamingClients(threading.Thread):
    """Greedy streams of 48 tokens through the official client, one after another, until stopped; each failure is
    kept (a stream that ends early or raises)."""

    def __init__(self, gateway: str):
        super().__init__(daemon=True)
        self.gateway, self.num_ok, self.failures = gateway, 0, []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                text, usage = _stream(self.gateway, 48)
                if usage is None or usage.completion_tokens < 1:
                    self.failures.append(f"no usage: {text!r}")
                else:
                    self.num_ok += 1
            except openai.OpenAIError as exc:
                self.failures.append(repr(exc))

    def stop(self):
        self.halt.set()
        self.join(120)


def test_a_vllm_argument_vllm_refuses_is_a_400_naming_the_field_and_creates_nothing(live, tiny_model_dir):
    response = live.api("POST", "deployments/", json={
        "name": "it-vllm-bad", "mode": "colocated", "model_path": str(tiny_model_dir),
        "engine_settings": {"engine": "vllm", "extra_args": ["--max-loras", "two"]},
        "replicas": {"colocated": 1}, "gateway_port": free_port()},
        # the check asks vLLM's own parser in a process that imports vLLM first (seconds; more on a loaded host)
        timeout=environment.CHECK_TIMEOUT_S + 30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == "engine_settings.common.extra_args"
    assert "invalid int value: 'two'" in error["message"]
    assert live.api("GET", "deployments/it-vllm-bad/").status_code == 404


def test_the_node_reports_the_vllm_it_runs_workers_with(live):
    node = live.wait_for("the agent to report its engines", lambda: (
        lambda n: n if n.get("engines") else None)(live.api("GET", f"nodes/{live.node_name}/").json()), timeout=60)
    assert node["engines"]["vllm"]["version"] == "0.32.0", node["engines"]
    assert node["detected_labels"]["engine.vllm"] == "0.32.0"


def _client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=60)


def _stream(gateway: str, max_tokens: int, on_text=None, **extra) -> tuple[str, object]:
    chunks, usage = [], None
    for chunk in _client(gateway).completions.create(model=NAME, prompt=PROMPT, max_tokens=max_tokens,
                                                     temperature=0, stream=True, extra_body=extra or None,
                                                     stream_options={"include_usage": True}):
        if chunk.choices:
            chunks.append(chunk.choices[0].text)
            if on_text is not None:
                on_text(len(chunks))
        if chunk.usage is not None:
            usage = chunk.usage
    return "".join(chunks), usage


def test_vllm_workers_stream_through_the_gateway_and_report_tandem_series(live, vllm_gateway):
    text, usage = _stream(vllm_gateway, 12)
    assert text and usage.completion_tokens == 12 and usage.prompt_tokens > 0
    chat = _client(vllm_gateway).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, temperature=0)
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"

    def scraped(metric):
        # A quantile needs requests between two scrapes: one more each time it is looked for.
        _client(vllm_gateway).completions.create(model=NAME, prompt=PROMPT, max_tokens=4)
        body = live.api("GET", "metrics/query", params={"metric": metric, "deployment": NAME,
                                                        "role": "colocated"}).json()
        pools = [s for s in body.get("series", []) if s["worker_id"] is None and s["points"]]
        return pools[0]["points"] if pools else None

    # vLLM's own series, renamed to Tandem's: the TTFT the workers measured, and their KV cache use.
    ttft = live.wait_for("vLLM's TTFT in the pool's series", lambda: (
        lambda points: points if points and max(v for _, v in points) > 0 else None)(scraped("ttft_p50_seconds")),
        timeout=60, interval=1)
    assert max(v for _, v in ttft) < 60
    assert live.wait_for("vLLM's KV cache use in the pool's series", lambda: scraped("kv_cache_usage_ratio"),
                         timeout=30, interval=1)


def test_an_alert_on_the_vllm_pools_ttft_p99_scales_it(live, vllm_gateway):
    rule = live.api("POST", "alert-rules/", json={
        "name": "it-vllm-ttft", "deployment": NAME, "role": "colocated", "metric": "ttft_p99_seconds",
        "comparison": ">", "threshold": 0.000001, "for_s": 0, "actions": [{"type": "scale", "step": 1}]})
    assert rule.status_code == 201, rule.text
    try:
        def scaled():
            _client(vllm_gateway).completions.create(model=NAME, prompt=PROMPT, max_tokens=4)
            return [a for a in live.actions(NAME, kind="scale") if a["actor_type"] == "rule"]

        action, = live.wait_for("the rule's scale action", scaled, timeout=120, interval=1)
    finally:
        live.api("DELETE", f"alert-rules/{rule.json()['id']}/")
    assert (action["params"]["from"], action["params"]["to"]) == (1, 2) and "it-vllm-ttft" in action["reason"]
    _ready(live, 2)


def _in_flight_on(gateway: str, headers: dict) -> set[str]:
    """The URLs of the workers the gateway has a request in flight on."""
    response = requests.get(f"{gateway}/metrics", timeout=10, headers=headers)
    assert response.status_code == 200, response.text
    return {sample.labels["worker"] for family in text_string_to_metric_families(response.text)
            if family.name == "tandem_gateway_worker_outstanding_requests"
            for sample in family.samples if sample.value >= 1}


def _metric(url: str, name: str, headers: dict | None = None) -> float:
    """The sum of a metric's samples on a /metrics page (0 where it has none); a gateway's answers the scrape token
    only (`headers`)."""
    response = requests.get(f"{url}/metrics", timeout=10, headers=headers)
    assert response.status_code == 200, response.text
    page = response.text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{")
               or line.startswith(name + " "))


def test_a_vllm_worker_killed_mid_stream_moves_the_stream_token_for_token(live, vllm_gateway):
    _ready(live, 2)  # another worker to move to
    reference, reference_usage = _stream(vllm_gateway, NUM_TOKENS, ignore_eos=True)
    operator = live.scrape_headers()
    killed, moved = [], False  # every worker killed, in order; whether a kill moved its stream
    # Kill the worker while it still generates the stream. Under load a worker may have sent every token before the
    # client has read five (the gateway still holds the request for the client), or between the check and the kill:
    # then nothing moves, and the attempt is made again with another stream (after a kill, once the killed worker is
    # back) rather than a kill that shows nothing. On a loaded host several tries in a row can: each costs one
    # stream's seconds, and a restart only after a kill.
    for _attempt in range(12):
        workers = {w["id"]: w for w in _ready(live, 2)}
        url = {wid: f"http://{w['host']}:{w['port']}" for wid, w in workers.items()}
        migrations_before = _metric(vllm_gateway, "tandem_request_migrations_total", operator)
        five_in, result, victim = threading.Event(), {}, None

        def stream():
            result["text"], result["usage"] = _stream(vllm_gateway, NUM_TOKENS, lambda n: n >= 5 and five_in.set(),
                                                      ignore_eos=True)

        client = threading.Thread(target=stream)
        client.start()
        assert five_in.wait(60)
        # The worker streaming it: the one the gateway has a request in flight on (the gateway's own count).
        # None: the worker had already sent every token (the gateway still relays them): try another stream.
        serving = [workers[wid] for wid in workers if url[wid] in _in_flight_on(vllm_gateway, operator)]
        assert len(serving) <= 1, serving
        if serving and _metric(url[serving[0]["id"]], "vllm:num_requests_running") >= 1:
            victim = serving[0]
            os.kill(victim["pid"], signal.SIGKILL)
            killed.append(victim)
        client.join(120)
        assert not client.is_alive()
        # Killed or not, moved or not, the client gets the stream it would have got from one worker.
        assert result["text"] == reference
        assert result["usage"].completion_tokens == reference_usage.completion_tokens == NUM_TOKENS
        assert result["usage"].prompt_tokens == reference_usage.prompt_tokens
        if victim is not None and _metric(vllm_gateway, "tandem_request_migrations_total",
                                          operator) == migrations_before + 1:
            moved = True
            break
    assert moved, f"no kill landed while its worker still generated ({len(killed)} kills)"
    def restarted():
        worker = live.api("GET", f"workers/{victim['id']}/").json()
        return worker if worker["status"] == "ready" and worker["pid"] != victim["pid"] else None

    live.wait_for("the killed vLLM worker to be restarted", restarted, timeout=400, interval=1)
    restarts = [a for a in live.actions(NAME, kind="restart") if a["worker"] == victim["id"]]
    num_kills = sum(1 for worker in killed if worker["id"] == victim["id"])
    assert len(restarts) == num_kills, [(a["reason"][:300], a["status"], a["created_at"]) for a in restarts]
    assert all(a["reason"].startswith("process killed by signal 9 (SIGKILL)") for a in restarts)


def test_a_paused_vllm_worker_passes_the_chaos_hypothesis(live, vllm_gateway):
    _ready(live, 2)
    chaos = f"deployments/{NAME}/chaos"
    assert live.api("PUT", chaos, json={"enabled": True, "reason": "vLLM integration test"}).status_code == 200
    created = live.api("POST", f"{chaos}/experiments", json={
        "name": "pause-vllm", "target": {"role": "colocated", "count": 1}, "faults": [{"kind": "pause"}],
        "duration_s": 4, "hypothesis": [{"metric": "error_ratio", "max": 0.05, "window_s": 4},
                                        {"metric": "ready_workers", "role": "colocated", "min": 1}],
        "recovery_timeout_s": 60})
    assert created.status_code == 201, created.text
    clients = StreamingClients(vllm_gateway)
    clients.start()
    try:
        def started():
            response = live.api("POST", f"{chaos}/experiments/pause-vllm/run", json={})
            assert response.status_code in (201, 409), response.text
            return response.json() if response.status_code == 201 else None

        run = live.wait_for("the hypothesis to hold and the run to start", started, timeout=60, interval=1)
        live.wait_for("the run to finish", lambda: live.api("GET", f"{chaos}/runs/{run['id']}").json()["status"]
                      == "finished", timeout=120, interval=1)
    finally:
        clients.stop()
    report = live.api("GET", f"{chaos}/runs/{run['id']}/report").json()
    fault, = report["faults"]
    assert fault["injected"]["outcome"] == "paused" and fault["reverted"]["outcome"] == "resumed", report
    assert report["verdict"] == "passed", report
    assert clients.failures == [] and clients.num_ok > 0


def test_scaling_a_vllm_pool_down_under_streaming_load_fails_no_request(live, vllm_gateway):
    _ready(live, 2)
    clients = StreamingClients(vllm_gateway)
    clients.start()
    try:
        live.wait_for("streams to flow", lambda: clients.num_ok >= 2, timeout=60)
        scaled = live.api("POST", f"deployments/{NAME}/scale", json={"role": "colocated", "replicas": 1})
        assert scaled.status_code == 202, scaled.text
        _ready(live, 1, timeout=120)
        done = clients.num_ok
        live.wait_for("streams on the one left", lambda: clients.num_ok >= done + 2, timeout=60)
    finally:
        clients.stop()
    assert clients.failures == []
