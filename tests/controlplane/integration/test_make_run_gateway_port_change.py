"""A later `make run` (`manage.py tandem_run`, tiny model): it reaches a serving demo deployment, moves the demo's
gateway to another TANDEM_GATEWAY_PORT than the demo was created with (an action row says so) instead of ignoring
the setting, and Ctrl-C (SIGINT) stops every child it started and every worker process the agent started."""
from __future__ import annotations

import re
import signal

import psutil
import pytest
import requests

from tests.controlplane.integration.make_run import PASSWORD, MakeRun
from tests.procs import free_port

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_later_run_moves_the_demo_gateway_serves_and_ctrl_c_stops_everything_it_started(tmp_path, tiny_model_dir):
    run = MakeRun(tmp_path, tiny_model_dir)
    try:
        old_port = free_port()
        # An earlier run created the demo on old_port (and stopped its processes when it ended).
        run.manage("migrate", "--verbosity", "0")
        run.python("from pathlib import Path; from django.conf import settings; "
                   "from controlplane.run.demo import demo_deployment_ensure as ensure; "
                   "ensure(Path(settings.TANDEM_MODELS_DIR) / 'tiny')", )
        run.python(f"from controlplane.models import Deployment; "
                   f"Deployment.objects.filter(name='demo').update(gateway_port={old_port})")
        run.start()
        output = run.wait_output("Tandem is ready in")
        assert f"gateway moved from port {old_port} to {run.gateway_port}" in output, output
        assert f"curl -s {run.gateway_url}/v1/completions" in output
        assert f"{run.web_url}/" in output and "password from TANDEM_ADMIN_PASSWORD" in output
        assert PASSWORD not in output

        response = requests.post(f"{run.gateway_url}/v1/completions", timeout=60,
                                 json={"model": "demo", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        token = re.search(r"API token\s+([0-9a-f]{40})", output).group(1)
        assert run.api("GET", "deployments/demo/", token).json()["gateway_port"] == run.gateway_port
        moved = [a for a in run.api("GET", "actions/", token, params={"deployment": "demo", "kind": "restart"})
                 .json()["results"] if a["params"].get("to_port") == run.gateway_port]
        assert moved and moved[0]["actor"] == "tandem_run" and moved[0]["params"]["from_port"] == old_port

        workers = run.api("GET", "workers/", token).json()
        ready = [w for w in workers if w["status"] == "ready"]
        assert sorted(w["role"] for w in ready) == ["decode", "gateway", "prefill"]
        child_pids = [child.pid for child in psutil.Process(run.proc.pid).children()]
        assert len(child_pids) == 4  # web, control, beat, agent

        run.proc.send_signal(signal.SIGINT)
        assert run.wait_exit(timeout=90) == 0, run.output()
        assert "stopped in" in run.output()
        assert all(_gone(pid) for pid in child_pids + [w["pid"] for w in ready]), run.output()
    finally:
        run.stop()
