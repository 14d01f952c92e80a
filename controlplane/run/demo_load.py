"""The light stream of demo requests `make run` sends once the gateway answers, so that the pages show live numbers;
and, once the demo requires API keys, the load's own key (a tenant of its own), so that it keeps flowing and is
counted as one tenant among others instead of as a stream of 401s."""
from __future__ import annotations

import secrets
import threading
import time

import requests
from django.db import connection

from controlplane import tenant_provider
from controlplane.run.demo import DEMO_NAME

DEMO_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three colours:",
    "Once upon a time",
]


def completion(gateway_url: str, prompt: str, *, max_tokens: int = 16, timeout: float = 60.0,
               model: str = DEMO_NAME, key: str | None = None) -> requests.Response:
    return requests.post(f"{gateway_url}/v1/completions", timeout=timeout,
                         headers={"Authorization": f"Bearer {key}"} if key else None,
                         json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.7})


DEMO_LOAD_TENANT = "demo-load"


def demo_load_key(deployment_name: str) -> str:
    """A key of the tenant `demo-load`, for the demo load once its deployment requires keys (the tenants app makes it:
    controlplane.tenant_provider)."""
    key = tenant_provider.service_key(DEMO_LOAD_TENANT, deployment_name)
    if key is None:
        raise RuntimeError("no tenants app to issue the demo load a key")
    return key


# The likely cause of a demo request's failure, by its status, for the console line.
_LIKELY_CAUSE = {401: "the deployment requires an API key", 404: "the model name is not served here",
                 429: "a tenant limit or the gateway's queue is full", 502: "a worker failed the request",
                 503: "no worker is ready (see the deployment page)", 504: "the request ran past its deadline"}


def failure_line(response: requests.Response) -> str:
    """`HTTP 503 (likely: ...): <the error's own message>`, the message whole up to 300 characters, cut at a word."""
    try:
        message = str(response.json()["error"]["message"]).strip()
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()
    if len(message) > 300:
        message = message[:300].rsplit(" ", 1)[0] + " ..."
    cause = _LIKELY_CAUSE.get(response.status_code)
    return f"HTTP {response.status_code}" + (f" (likely: {cause})" if cause else "") + f": {message}"


class DemoLoad(threading.Thread):
    """One small completion every interval_s through the gateway, so the dashboards show live numbers.
    Failures are counted and reported in a line per minute at most, never raised."""

    def __init__(self, gateway_url: str, *, interval_s: float = 2.0, model: str = DEMO_NAME, report=print,
                 key_for=demo_load_key):
        super().__init__(name=f"{model}-load", daemon=True)
        self.gateway_url, self.interval_s, self.report, self.model = gateway_url, interval_s, report, model
        self.key_for = key_for  # key_for(model): the load's own key, once the deployment requires one
        self.key: str | None = None
        self.num_ok = self.num_failed = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_report, last_error = time.monotonic(), ""
        while not self._stop_event.wait(self.interval_s):
            try:
                response = completion(self.gateway_url, secrets.choice(DEMO_PROMPTS), model=self.model,
                                      key=self.key)
                if response.status_code == 401 and self.key is None:
                    try:
                        self.key = self.key_for(self.model)
                    finally:
                        connection.close()  # this thread's own database connection
                    self.report(f"demo load: {self.model} now requires an API key; the load sends a key of tenant "
                                f"{DEMO_LOAD_TENANT!r} (its requests count as that tenant's; delete the tenant or "
                                "set TANDEM_DEMO_LOAD=0 to stop them)")
                    continue
                if response.status_code == 200:
                    self.num_ok += 1
                else:
                    self.num_failed += 1
                    last_error = failure_line(response)
            except requests.RequestException as exc:
                self.num_failed += 1
                last_error = type(exc).__name__
            if last_error and time.monotonic() - last_report > 60:
                self.report(f"demo load: {self.num_ok} ok, {self.num_failed} failed (last: {last_error})")
                last_report, last_error = time.monotonic(), ""

    def stop(self) -> None:
        self._stop_event.set()
