"""Agent tests run real child processes: a stand-in for `python -m inference.worker` that serves /health on its
port (the real worker needs a model; the integration tests run that)."""
from __future__ import annotations

import sys

import pytest


FAKE_WORKER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


@pytest.fixture
def fake_worker_argv(monkeypatch, tmp_path, settings):
    """Workers started by the agent in this test run FAKE_WORKER; logs go under tmp_path."""
    from controlplane.agent import launch

    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    monkeypatch.setattr(launch, "argv_for", lambda worker, port: [sys.executable, "-c", FAKE_WORKER, str(port)])


@pytest.fixture
def cleanup_processes():
    """Handles to stop at the end of the test, whatever happened."""
    from controlplane.agent import processes

    handles = []
    yield handles
    for handle in handles:
        processes.stop(handle, deadline_s=2)
