"""A later `make run` whose ports are taken says so within seconds, naming the port, its setting and the process
that holds it, instead of starting a gateway that crash-loops into `failed` behind a 600 s wait."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

from tests.controlplane.integration.make_run import MakeRun
from tests.procs import ROOT

pytestmark = pytest.mark.integration


def _listener(port: int) -> subprocess.Popen:
    """Someone else's server on `port` (python -m http.server), answering before this returns."""
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except requests.RequestException:
            assert proc.poll() is None and time.monotonic() < deadline, "http.server did not start"
            time.sleep(0.1)


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    run = MakeRun(tmp_path, tiny_model_dir)
    yield run
    run.stop()


def test_a_busy_gateway_port_on_a_later_run_is_an_error_naming_its_holder(run):
    # An earlier run created the demo with this gateway port.
    run.manage("migrate", "--verbosity", "0")
    run.python("from pathlib import Path; from django.conf import settings; "
               "from controlplane.run.demo import demo_deployment_ensure as ensure; "
               "ensure(Path(settings.TANDEM_MODELS_DIR) / 'tiny')")
    holder = _listener(run.gateway_port)
    try:
        started = time.monotonic()
        run.start()
        code = run.wait_exit(timeout=90)
        output = run.output()
        assert code != 0, output
        assert time.monotonic() - started < 90
        assert f"port {run.gateway_port} (the demo gateway's, TANDEM_GATEWAY_PORT) is in use by pid {holder.pid}" \
               in output, output
        assert "http.server" in output and "set TANDEM_GATEWAY_PORT to a free port" in output
        assert "started web" not in output  # nothing was started
    finally:
        holder.kill()
        holder.wait(10)


def test_a_busy_web_port_is_an_error_naming_its_holder(run):
    holder = _listener(run.web_port)
    try:
        run.start()
        assert run.wait_exit(timeout=90) != 0
        output = run.output()
        assert f"port {run.web_port} (the web server's, TANDEM_WEB_PORT) is in use by pid {holder.pid}" in output
        assert "http.server" in output, output
    finally:
        holder.kill()
        holder.wait(10)
