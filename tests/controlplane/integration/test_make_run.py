"""`make run`'s supervisor (`manage.py tandem_run`) with the tiny model: it reaches a serving demo deployment, and
Ctrl-C (SIGINT) stops every child it started and every worker process the agent started."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

from tests.controlplane.integration.live import FAST_ENV, IsolatedServices
from tests.controlplane.integration.make_run import READY_TIMEOUT_S
from tests.procs import ROOT, free_port

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_make_run_serves_the_demo_and_ctrl_c_stops_everything_it_started(tmp_path, tiny_model_dir):
    var_dir = tmp_path / "var"
    services = IsolatedServices(var_dir)
    web_port, gateway_port = free_port(), free_port()
    env = {**os.environ, **FAST_ENV, **services.env, "TANDEM_VAR_DIR": str(var_dir),
           "TANDEM_WEB_PORT": str(web_port), "TANDEM_GATEWAY_PORT": str(gateway_port),
           "TANDEM_DEMO_MODEL": "tiny", "TANDEM_DEMO_LOAD": "0", "TANDEM_ADMIN_PASSWORD": "correct-horse-battery",
           # The tiny model the test session already built: prepare is then instant.
           "TANDEM_MODELS_DIR": str(tiny_model_dir.parent)}
    output = tmp_path / "make-run.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "tandem_run"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "Tandem is ready in" not in output.read_text():
            assert proc.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.5)
        text = output.read_text()
        token = re.search(r"API token\s+([0-9a-f]{40})", text).group(1)
        assert f"http://127.0.0.1:{web_port}/" in text and "password from TANDEM_ADMIN_PASSWORD" in text
        assert "correct-horse-battery" not in text

        response = requests.post(f"http://127.0.0.1:{gateway_port}/v1/completions", timeout=30,
                                 json={"model": "demo", "prompt": "Hello", "max_tokens": 4})
        assert response.status_code == 200, response.text
        workers = requests.get(f"http://127.0.0.1:{web_port}/api/v1/workers/", timeout=10,
                               headers={"Authorization": f"Token {token}"}).json()
        worker_pids = [w["pid"] for w in workers if w["status"] == "ready"]
        assert sorted(w["role"] for w in workers if w["status"] == "ready") == ["decode", "gateway", "prefill"]
        child_pids = [child.pid for child in psutil.Process(proc.pid).children()]
        assert len(child_pids) == 4  # web, control, beat, agent

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, output.read_text()
        assert "stopped in" in output.read_text()
        assert all(_gone(pid) for pid in child_pids + worker_pids), output.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        services.close()
