"""Real worker and gateway processes for the gateway tests, and the Hugging Face reference they are held to."""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import requests
from aiohttp import web

from tests.procs import Proc, free_port, start, wait_http

WORKER_ARGS = ["--threads", "1", "--kv-cache-bytes", "16M", "--max-model-len", "512"]


def start_workers(specs: list[tuple], model_dir: Path, log_dir: Path, extra: list[str] = (),
                  env: dict | None = None, timeout: float = 180) -> list[Proc]:
    """Start one worker per (name, role) or (name, role, its own extra args) at once, then wait for all: model loads
    overlap."""
    procs = []
    for name, role, *own in specs:
        port = free_port()
        proc = start(name, ["-m", "inference.worker", "--role", role, "--model", str(model_dir), "--port", str(port),
                            *WORKER_ARGS, *extra, *(own[0] if own else ())], log_dir, env=env)
        proc.url = f"http://127.0.0.1:{port}"
        procs.append(proc)
    try:
        for proc in procs:
            wait_http(proc, proc.url + "/health", timeout=timeout)
    except BaseException:
        stop_all(procs)
        raise
    return procs


_SHARED: dict[str, list[Proc]] = {}
# Plain workers (default settings) that most gateway tests can share; a test that kills or reconfigures a worker
# starts its own.
PLAIN_FLEET = [("prefill", "prefill"), ("decode", "decode"), ("colocated", "colocated")]


def shared_workers(request, tmp_path_factory, key: str, specs: list[tuple[str, str]], model_dir: Path,
                   extra: list[str] = (), env: dict | None = None) -> dict[str, Proc]:
    """Workers started once per test session under `key` (again if one has died), stopped when the session ends.

    Worker start-up (importing torch, loading the model) is most of the gateway tests' time, and the gateway is
    what they test, so the modules share workers rather than each starting its own."""
    procs = _SHARED.get(key)
    if procs is None or not all(p.alive() for p in procs):
        if procs is None:
            request.config.add_cleanup(lambda: stop_all(_SHARED.pop(key, [])))
        else:
            stop_all(procs)
        _SHARED[key] = start_workers(specs, model_dir, tmp_path_factory.mktemp(f"workers-{key}"), extra, env)
    return {name: proc for (name, _), proc in zip(specs, _SHARED[key])}


# One worker that holds at most one request (--max-num-seqs 1 --max-queue 0), for the modules that fill it, stop it
# (SIGSTOP) or kill it; restarted if killed.
SINGLE_FLEET = [("colocated-single", "colocated")]
SINGLE_ARGS = ["--max-num-seqs", "1", "--max-queue", "0"]


def single_worker(request, tmp_path_factory, model_dir: Path) -> Proc:
    return shared_workers(request, tmp_path_factory, "single", SINGLE_FLEET, model_dir,
                          SINGLE_ARGS)["colocated-single"]


def start_gateway(name: str, args: list[str], log_dir: Path, *, wait_ready: bool = True) -> Proc:
    port = free_port()
    proc = start(name, ["-m", "inference.gateway", "--port", str(port), *args], log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    try:
        wait_http(proc, proc.url + ("/health" if wait_ready else "/v1/models"), timeout=60)
    except BaseException:
        proc.stop()
        raise
    return proc


def stop_all(procs: list[Proc], timeout: float = 15.0) -> None:
    """SIGTERM every process first, then wait for each: their shutdowns overlap."""
    for proc in procs:
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.stop(timeout)


def urls(procs: list[Proc]) -> str:
    return ",".join(p.url for p in procs)


def complete(base_url: str, body: dict, timeout: float = 60) -> requests.Response:
    return requests.post(base_url + "/v1/completions", json=body, timeout=timeout)


def sse_events(resp: requests.Response) -> list:
    """The `data:` payloads of an SSE answer, JSON-decoded except the final [DONE]."""
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def hf_greedy_texts(model_dir: Path, prompts: list[str], max_tokens: int) -> list[str]:
    """What Hugging Face's own generate makes of each prompt, greedily, tokenized as the worker does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = []
    with torch.inference_mode():
        for prompt in prompts:
            input_ids = torch.tensor([tokenizer.encode(prompt)])  # input_ids: [1, S]
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id)
            generated = out[0, input_ids.shape[1]:].tolist()
            texts.append(tokenizer.decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=False))
    return texts


def restart(proc: Proc, wait: bool = True) -> Proc:
    """Start a stopped or killed worker again with the same arguments (same port, so a gateway with static URLs
    takes it back once its probe finds it healthy); its log goes to a new file. With wait=False it returns at once:
    its start (torch import, model load) can overlap other work."""
    proc.stop()
    again = start(proc.name + "-again", list(proc.popen.args[1:]), proc.log_path.parent)
    again.url = proc.url
    if wait:
        wait_http(again, again.url + "/health", timeout=180)
    return again


def worker_states(gateway_url: str) -> dict[str, tuple[str, int]]:
    """url -> (state, outstanding requests) of every worker, as the gateway's /health reports them."""
    health = requests.get(gateway_url + "/health", timeout=10).json()
    return {w["url"]: (w["state"], w["outstanding"]) for group in health["groups"]
            for role in ("prefill", "decode", "colocated") for w in group.get(role, [])}


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# Requests any anonymous client can send that once made a worker answer 500 (a lone UTF-16 surrogate reached its
# tokenizer) or the gateway answer 500 (json.loads recursed 5,000 levels deep): (name, path, raw body).
HOSTILE_REQUESTS = [
    ("surrogate_prompt", "/v1/completions", b'{"model": "tandem", "prompt": "hello \\ud800 world", "max_tokens": 4}'),
    ("surrogate_chat", "/v1/chat/completions",
     b'{"model": "tandem", "messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 4}'),
    ("deep_prompt", "/v1/completions", b'{"model": "tandem", "max_tokens": 4, "prompt": ' + _nested(5000) + b"}"),
    ("deep_chat", "/v1/chat/completions", b'{"model": "tandem", "messages": ' + _nested(5000) + b"}"),
]


TOKEN = "s3cret-token"


class ControlPlane:
    """A stand-in control plane: a real HTTP server (on its own thread) speaking the documented endpoints contract.
    Serves GET /api/v1/deployments/demo/endpoints from `self.endpoints`, and a shared gateway's
    GET /api/v1/gateways/front/endpoints from `self.shared`; 503 everything while `self.down`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoints: dict = {"deployment": "demo", "model": "demo", "mode": "colocated", "groups": []}
        self.shared: dict = {"gateway": "front", "deployments": []}
        self.down = False
        self.delay_s = 0.0  # how long each answer takes (a control plane under load)
        self.num_polls = 0
        self.authorizations: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _endpoints(self, request: web.Request) -> web.Response:
        self.num_polls += 1
        self.authorizations.add(request.headers.get("Authorization", ""))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            return web.json_response({"detail": "maintenance"}, status=503)
        if request.headers.get("Authorization") != f"Token {TOKEN}":
            return web.json_response({"detail": "Invalid token."}, status=401)
        return web.json_response(self.shared if request.path.startswith("/api/v1/gateways/") else self.endpoints)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/api/v1/deployments/demo/endpoints", self._endpoints)
        app.router.add_get("/api/v1/gateways/front/endpoints", self._endpoints)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def wait_polls(self, num: int, timeout: float = 15) -> None:
        target = self.num_polls + num
        deadline = time.monotonic() + timeout
        while self.num_polls < target:
            assert time.monotonic() < deadline, f"the gateway polled {self.num_polls} times, expected {target}"
            time.sleep(0.05)
