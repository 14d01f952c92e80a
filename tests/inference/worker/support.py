"""Helpers for the worker tests: start a real worker process, read NDJSON streams, read one metric."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests import procs

# A worker's start (torch import, model load) on a shared host: at load ~22, several loading at once took over 120 s.
START_TIMEOUT_S = 360.0
HTTP_TIMEOUT_S = 60.0


def start_worker(name: str, role: str, model_dir: Path, log_dir: Path, *extra: str, env: dict | None = None,
                 wait: bool = True) -> procs.Proc:
    port = procs.free_port()
    args = ["-m", "inference.worker", "--role", role, "--model", str(model_dir), "--port", str(port),
            "--threads", "1", "--kv-cache-bytes", "8M", *extra]
    proc = procs.start(name, args, log_dir, env=env)
    proc.url = f"http://127.0.0.1:{port}"
    if wait:
        procs.wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S)
    return proc


@contextmanager
def workers_started(roles: tuple[str, ...], model_dir: Path, log_dir: Path, *extra: str, env: dict | None = None):
    """One real worker per role, started together (their model loads overlap), each named after its role; all
    stopped at the end."""
    started = {}
    try:
        for role in roles:
            started[role] = start_worker(role, role, model_dir, log_dir, *extra, env=env, wait=False)
        for proc in started.values():
            procs.wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def read_stream(response: requests.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.iter_lines() if line]


def generate(url: str, **body) -> list[dict]:
    with requests.post(f"{url}/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        return read_stream(r)


def token_ids(events: list[dict]) -> list[int]:
    return [t for e in events if e["type"] == "token" for t in e["token_ids"]]


def text(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "token")


def metric(url: str, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    body = requests.get(f"{url}/metrics", timeout=HTTP_TIMEOUT_S).text
    total = 0.0
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def assert_openai_error(response: requests.Response, status: int, *fragments: str) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return error
