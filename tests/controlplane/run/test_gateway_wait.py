"""make run's wait for the demo gateway: it asks the gateway's /health (ready once its membership has a group that
can serve), never sends a completion (which the gateway would count as a client error), and a Ctrl-C ends it
without a false timeout."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.run.demo import NotReady, gateway_wait


class FakeGateway:
    """A real HTTP server that answers /health 503 until `ready` is set, then 200, and records every request."""

    def __init__(self):
        self.requests: list[tuple[str, str]] = []
        self.ready = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                fake.requests.append((self.command, self.path))
                ok = self.path == "/health" and fake.ready.is_set()
                body = json.dumps({"status": "ok" if ok else "unavailable", "groups": []}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway():
    fake = FakeGateway()
    yield fake
    fake.close()


def test_it_waits_on_health_and_never_sends_a_completion(gateway):
    threading.Timer(1.0, gateway.ready.set).start()
    waited = gateway_wait(gateway.url, timeout_s=60, interval_s=0.05)
    assert waited is not None and waited >= 0.9
    assert {request for request in gateway.requests} == {("GET", "/health")}
    assert len(gateway.requests) >= 2  # it did ask while the gateway was not ready yet


def test_ctrl_c_ends_the_wait_without_a_timeout(gateway):
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    assert gateway_wait(gateway.url, timeout_s=600, is_running=lambda: not stop.is_set(), interval_s=0.05) is None
    assert time.monotonic() - started < 30


def test_a_gateway_that_never_gets_ready_times_out(gateway):
    with pytest.raises(TimeoutError, match="did not answer within 1 s"):
        gateway_wait(gateway.url, timeout_s=1, interval_s=0.05)


def test_a_failed_worker_ends_the_wait_with_what_went_wrong(gateway):
    def check():
        raise NotReady("the demo's gateway worker #3 failed: address already in use")

    with pytest.raises(NotReady, match="address already in use"):
        gateway_wait(gateway.url, timeout_s=60, check=check, interval_s=0.05)
