"""For operators who keep Prometheus and Grafana: GET /api/v1/prometheus/targets (http_sd) lists every scraped
worker and gateway with the labels Tandem's queries use, and GET /api/v1/deployments/{name}/grafana.json is an
importable Grafana dashboard whose every expression promtool parses."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from controlplane.models import Node

pytestmark = pytest.mark.django_db


def test_the_targets_are_http_sd_groups_of_the_scraped_workers_with_their_labels(viewer_api, deployment, make_worker):
    ready = make_worker(deployment, "decode", status="ready", port=41002)
    make_worker(deployment, "prefill", status="stopped", port=41001)  # no process: not a target
    answer = viewer_api.get("/api/v1/prometheus/targets")
    assert answer.status_code == 200, answer.content
    node = Node.objects.get(pk=ready.node_id).name
    assert answer.json() == [{"targets": [f"{ready.host}:41002"], "labels": {
        "deployment": "demo", "pool": "decode", "revision": "1", "node": node, "worker": str(ready.pk),
        "engine": "tandem"}}]


def test_the_targets_need_a_token(anon_api):
    assert anon_api.get("/api/v1/prometheus/targets").status_code == 401


def test_the_grafana_dashboard_has_the_pages_panels_over_the_deployments_labels(viewer_api, deployment):
    answer = viewer_api.get("/api/v1/deployments/demo/grafana.json")
    assert answer.status_code == 200, answer.content
    assert "tandem-demo-grafana.json" in answer["Content-Disposition"]
    board = answer.json()
    assert board["schemaVersion"] >= 36 and board["uid"] == "tandem-demo"
    assert board["templating"]["list"][0]["type"] == "datasource"
    titles = [p["title"] for p in board["panels"]]
    for wanted in ("Time to first token by stage", "Inter-token latency by stage", "Requests per second (gateway)",
                   "Error ratio (gateway)", "KV cache usage by stage", "GPU utilisation by stage", "GPU temperature",
                   "Queue (requests waiting) by stage", "Prefix-cache hit rate", "Speculative acceptance"):
        assert wanted in titles
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert all('deployment="demo"' in e for e in exprs)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_an_unknown_deployment_is_a_404(viewer_api):
    answer = viewer_api.get("/api/v1/deployments/nope/grafana.json")
    assert answer.status_code == 404 and "nope" in answer.json()["error"]["message"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_parses_every_panel_expression(tmp_path):
    from controlplane.observability.prometheus import recording_rules_for_check

    path = tmp_path / "panels.yml"
    path.write_text(recording_rules_for_check("demo"))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
