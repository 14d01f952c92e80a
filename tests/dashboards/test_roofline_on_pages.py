"""The roofline on the pages: the overview's node table shows each host's measured peaks and bandwidth (or that it
has not measured yet), and each stage column of the deployment page its stage's efficiency, with a chart."""
from __future__ import annotations

import re

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _cell(html: str, testid: str) -> str:
    match = re.search(rf'data-testid="{re.escape(testid)}">(.*?)</td>', html, re.S)
    assert match, testid
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(1))).strip()


def test_the_node_table_shows_each_hosts_peaks_and_bandwidth(client_for, viewer, node):
    from controlplane.models import Node

    Node.objects.create(name="fresh", queue="node.fresh")
    node.roofline = {"source": "measured", "measured_at": timezone.now().isoformat(),
                     "one_thread": {"threads": 1, "matmul_gflops": {"float32": 57.9, "int8": 80.0}, "read_gbs": 12.5},
                     "all_cores": {"threads": 8, "matmul_gflops": {"float32": 400.0, "int8": 610.0},
                                   "read_gbs": 40.0}}
    node.save(update_fields=["roofline"])
    html = client_for(viewer).get("/").content.decode()
    assert "<th>roofline</th>" in html
    cell = _cell(html, "roofline-local")
    assert "1 thread: float32 57.9 · int8 80 GFLOP/s · read 12.5 GB/s" in cell
    assert "all 8 cores: float32 400 · int8 610 GFLOP/s · read 40 GB/s" in cell
    assert re.search(r"measured \d+s ago", cell)
    assert _cell(html, "roofline-fresh") == "not measured yet"


def test_a_simulated_node_says_its_figures_are_simulated(client_for, viewer, node):
    from controlplane.agent.host import SIMULATED_ROOFLINE

    node.roofline = {**SIMULATED_ROOFLINE, "measured_at": timezone.now().isoformat()}
    node.save(update_fields=["roofline"])
    assert "simulated" in _cell(client_for(viewer).get("/").content.decode(), "roofline-local")


def test_a_measurement_taken_under_load_says_so(client_for, viewer, node):
    node.roofline = {"source": "measured", "measured_at": timezone.now().isoformat(), "others_cores": 1.3,
                     "one_thread": {"threads": 1, "matmul_gflops": {"float32": 60.0}, "read_gbs": 12.0},
                     "all_cores": {"threads": 2, "matmul_gflops": {"float32": 41.0}, "read_gbs": 15.0}}
    node.save(update_fields=["roofline"])
    html = client_for(viewer).get("/").content.decode()
    warning = re.search(r'data-testid="roofline-disturbed-local">(.*?)</div>', html, re.S).group(1)
    assert "other processes kept 1.3 cores busy" in warning
    assert "all cores measured slower than one thread (float32)" in warning
    node.roofline = {**node.roofline, "others_cores": 0.1,
                     "all_cores": {"threads": 2, "matmul_gflops": {"float32": 115.0}, "read_gbs": 15.0}}
    node.save(update_fields=["roofline"])
    assert "roofline-disturbed-local" not in client_for(viewer).get("/").content.decode()


def test_each_stage_column_shows_its_stages_efficiency(client_for, viewer, deployment, seed_samples):
    seed_samples(deployment, "prefill_roofline_ratio", [0.5, 0.6], role="prefill")
    seed_samples(deployment, "decode_roofline_ratio", [0.12], role="decode")
    seed_samples(deployment, "decode_roofline_ratio", [0.9], role="prefill")  # another pool's: not the column's
    client = client_for(viewer)
    html = client.get("/deployments/demo/").content.decode()
    assert re.search(r'data-stage-value="prefill:prefill_roofline">60.0%<', html)
    assert re.search(r'data-stage-value="decode:decode_roofline">12.0%<', html)
    assert "Decode roofline per worker" in html
    figures = client.get("/deployments/demo/stages.json?range=15m").json()["figures"]
    assert "stage-decode-decode_roofline" in figures and "stage-prefill-prefill_roofline" in figures


def test_a_stage_without_figures_says_why_its_chart_is_empty(client_for, viewer, deployment, seed_samples):
    seed_samples(deployment, "ttft_p99_seconds", [0.4], role="prefill")  # data, but no roofline series
    figures = client_for(viewer).get("/deployments/demo/stages.json?range=15m").json()["figures"]
    text = figures["stage-prefill-prefill_roofline"]["layout"]["annotations"][0]["text"]
    assert "has not measured its host" in text
