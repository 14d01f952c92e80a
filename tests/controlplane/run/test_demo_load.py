"""make run's demo load once the demo requires API keys: its next request after a 401 carries a key of its own
tenant (`demo-load`, created with access to the demo), says so once on the console, and keeps the charts alive;
a failure's console line carries the error's whole message and its likely cause."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from controlplane.run.demo_load import DEMO_LOAD_TENANT, DemoLoad, demo_load_key, failure_line
from controlplane.tenants.models import Tenant, TenantKey

KEY = "tk-demo-load-0123456789"


class KeyedGateway(ThreadingHTTPServer):
    """Answers POST /v1/completions 200 with `Authorization: Bearer KEY`, else an OpenAI-shaped 401."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_port}"
        self.seen: list[str | None] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(self.headers.get("Authorization"))
        ok = self.headers.get("Authorization") == f"Bearer {KEY}"
        body = {"choices": [{"text": "ok"}]} if ok else {"error": {
            "message": "You didn't provide an API key: send it as 'Authorization: Bearer <key>' (the OpenAI "
                       "client's api_key).", "type": "invalid_request_error", "param": None,
            "code": "missing_api_key"}}
        data = json.dumps(body).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_after_a_401_the_load_sends_its_own_key_and_says_so_once():
    gateway, lines = KeyedGateway(), []
    load = DemoLoad(gateway.url, interval_s=0.02, report=lines.append, key_for=lambda model: KEY)
    load.start()
    try:
        deadline = time.monotonic() + 20
        while load.num_ok < 3:
            assert time.monotonic() < deadline, (gateway.seen, lines)
            time.sleep(0.02)
    finally:
        load.stop()
        gateway.shutdown()
    assert gateway.seen[0] is None and set(gateway.seen[1:]) == {f"Bearer {KEY}"}
    assert load.num_failed == 0
    line, = lines
    assert "demo now requires an API key" in line and "tenant 'demo-load'" in line


@pytest.mark.django_db
def test_the_loads_key_belongs_to_a_tenant_of_its_own_with_access_to_the_demo(deployment):
    key = demo_load_key("demo")
    tenant = Tenant.objects.get(name=DEMO_LOAD_TENANT)
    assert list(tenant.deployments.values_list("name", flat=True)) == ["demo"]
    assert TenantKey.objects.filter(tenant=tenant, key_hash=hashlib.sha256(key.encode()).hexdigest()).exists()
    demo_load_key("demo")  # once more (the next make run): the same tenant, another key
    assert Tenant.objects.filter(name=DEMO_LOAD_TENANT).count() == 1 and tenant.keys.count() == 2


def test_a_failure_line_keeps_the_whole_message_and_names_the_likely_cause():
    response = requests.models.Response()
    response.status_code = 503
    message = "no ready worker group: revision 1: no ready decode worker (http://127.0.0.1:41002: " + "x " * 40
    response._content = json.dumps({"error": {"message": message}}).encode()
    line = failure_line(response)
    assert line.startswith("HTTP 503 (likely: no worker is ready (see the deployment page)): no ready worker group")
    assert line.endswith("x")  # whole, not cut mid-word
