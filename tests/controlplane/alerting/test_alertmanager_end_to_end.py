"""A real Alertmanager (Debian's `prometheus-alertmanager`) routes an alert to the web process's receiver with a
bearer token, and the alert's tandem_action becomes a scale action."""
import shutil
import subprocess
import time
from datetime import datetime, timezone

import pytest
import requests

from tests.procs import free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ALERTMANAGER is None, reason="Alertmanager not installed (Debian package "
                                                   "`prometheus-alertmanager`)"),
]

CONFIG = """
route:
  receiver: tandem
  group_by: [alertname]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: tandem
    webhook_configs:
      - url: {url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {token}
"""


def wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout_s}s")


@pytest.fixture
def alertmanager(tmp_path, live_server, operator):
    from controlplane.services.tokens import token_issue

    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG.format(url=f"{live_server.url}/api/v1/webhooks/alertmanager",
                                    token=token_issue(user=operator, name="alertmanager")))
    port = free_port()
    log = open(tmp_path / "alertmanager.log", "w")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready():
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait(ready, 30, "ready Alertmanager")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_alertmanager_delivers_an_alert_that_scales_the_decode_pool(transactional_db, deployment, alertmanager):
    from controlplane.models import Action, Pool

    alert = {
        "labels": {"alertname": "DecodeSaturated", "deployment": "demo", "role": "decode", "severity": "page"},
        "annotations": {"tandem_action": "scale_up", "summary": "decode KV cache above 95%"},
        "startsAt": datetime.now(timezone.utc).isoformat(),
        "generatorURL": "http://prometheus.example/graph",
    }
    response = requests.post(f"{alertmanager}/api/v2/alerts", json=[alert], timeout=5)
    assert response.status_code == 200, response.text
    action = wait(lambda: Action.objects.filter(kind="scale", actor_type="webhook").first(), 30,
                  "scale action from Alertmanager")
    assert action.actor == "alertmanager:tandem"
    assert action.params == {"role": "decode", "from": 1, "to": 2}
    assert "DecodeSaturated" in action.reason
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2
