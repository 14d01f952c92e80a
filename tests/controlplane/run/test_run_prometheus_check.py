"""`make run` (`manage.py tandem_run`) with TANDEM_METRICS_BACKEND=prometheus asks TANDEM_PROMETHEUS_URL one PromQL
query before anything starts: an unreachable URL, or one that answers but is not Prometheus' API, stops it with one
line naming the setting; a real Prometheus passes."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, Prometheus
from tests.controlplane.test_settings import manage
from tests.procs import free_port


def _run(tmp_path, url: str):
    out = manage(["tandem_run"], tmp_path, TANDEM_METRICS_BACKEND="prometheus", TANDEM_PROMETHEUS_URL=url,
                 TANDEM_PROMETHEUS_TIMEOUT_S="2")
    assert out.returncode != 0, out.stdout + out.stderr
    assert not (tmp_path / "tandem.sqlite3").exists()  # it stopped before migrating (the SQLite default)
    return out.stderr.strip().splitlines()


def test_an_unreachable_url_stops_it_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    assert _run(tmp_path, url) == [f"CommandError: TANDEM_METRICS_BACKEND=prometheus: Prometheus at {url} did not "
                                   f"answer: ConnectionError; check TANDEM_PROMETHEUS_URL"]


@pytest.fixture
def not_prometheus():
    """A real HTTP server that answers every GET with an HTML 404, as a web server at a wrong URL does."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html><body>Not Found</body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_url_that_is_not_prometheus_stops_it_with_one_line(tmp_path, not_prometheus):
    assert _run(tmp_path, not_prometheus) == [
        f"CommandError: TANDEM_METRICS_BACKEND=prometheus: Prometheus at {not_prometheus} answered HTTP 404 without "
        f"JSON; check TANDEM_PROMETHEUS_URL"]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")
def test_a_real_prometheus_passes_the_check(tmp_path, settings):
    from controlplane.management.commands.tandem_run import Command

    prometheus = Prometheus(tmp_path / "data", tmp_path / "prometheus")
    try:
        settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", prometheus.url
        Command()._prometheus_check()  # raises CommandError otherwise
    finally:
        prometheus.stop()
