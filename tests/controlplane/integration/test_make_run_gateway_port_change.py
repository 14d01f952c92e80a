"""A `make run` with another TANDEM_GATEWAY_PORT than the demo was created with moves the demo's gateway there (an
action row says so) instead of ignoring the setting."""
from __future__ import annotations

import re

import pytest
import requests

from tests.controlplane.integration.make_run import MakeRun
from tests.procs import free_port

pytestmark = pytest.mark.integration


def test_a_changed_gateway_port_moves_the_demo_gateway(tmp_path, tiny_model_dir):
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

        response = requests.post(f"{run.gateway_url}/v1/completions", timeout=60,
                                 json={"model": "demo", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        token = re.search(r"API token\s+([0-9a-f]{40})", output).group(1)
        assert run.api("GET", "deployments/demo/", token).json()["gateway_port"] == run.gateway_port
        moved = [a for a in run.api("GET", "actions/", token, params={"deployment": "demo", "kind": "restart"})
                 .json()["results"] if a["params"].get("to_port") == run.gateway_port]
        assert moved and moved[0]["actor"] == "tandem_run" and moved[0]["params"]["from_port"] == old_port
    finally:
        run.stop()
