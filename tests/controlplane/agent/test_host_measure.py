"""The node agent measures its host in a child process (`python -m inference.roofline_measure`) and stores the
figures on its Node; a simulated fleet stores a simulated roofline and runs no benchmark; a failed measurement
leaves the node's figures as they were."""
from __future__ import annotations

import pytest

from controlplane.agent import host, runtime, tasks
from controlplane.models import Node

pytestmark = pytest.mark.django_db


def test_the_agent_measures_its_host_and_stores_the_figures(node):
    assert tasks.agent_measure_host(node.name) == "measured"
    roofline = Node.objects.get(pk=node.pk).roofline
    assert roofline["source"] == "measured" and roofline["measured_at"]
    one = roofline["one_thread"]
    assert one["threads"] == 1 and one["read_gbs"] > 0
    assert one["matmul_gflops"]["float32"] > 0 and one["matmul_gflops"]["int8"] > 0
    assert ("bfloat16" in one["matmul_gflops"]) == roofline["native_bfloat16"]
    assert roofline["all_cores"]["threads"] == roofline["cpu_count"]


def test_a_simulated_node_gets_a_simulated_roofline_without_a_benchmark(node, monkeypatch):
    monkeypatch.setattr(runtime, "simulated", True)
    monkeypatch.setattr(host, "roofline_measure", lambda: pytest.fail("a simulated node ran a benchmark"))
    assert host.host_measure(node_name=node.name) == "simulated"
    roofline = Node.objects.get(pk=node.pk).roofline
    assert roofline["source"] == "simulated" and roofline["one_thread"] == host.SIMULATED_ROOFLINE["one_thread"]


def test_a_failed_measurement_keeps_the_previous_figures(node, monkeypatch):
    node.roofline = {"source": "measured", "one_thread": {"threads": 1, "matmul_gflops": {"float32": 1.0}}}
    node.save(update_fields=["roofline"])
    monkeypatch.setattr(host, "MEASURE_MODULE", "inference.no_such_module")
    assert host.host_measure(node_name=node.name) == "failed"
    assert Node.objects.get(pk=node.pk).roofline["one_thread"]["matmul_gflops"] == {"float32": 1.0}


def test_an_unknown_node_is_gone():
    assert host.host_measure(node_name="nowhere") == "gone"


def test_other_processes_busy_during_a_measurement_are_counted():
    """A CPU hog beside the measured code: its cores are read from /proc and the measurement flagged."""
    import subprocess
    import sys
    import time

    from inference.roofline import disturbance
    from inference.roofline_measure import others_during

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _, others = others_during(lambda: time.sleep(1.0))
    finally:
        hog.kill()
        hog.wait()
    assert others >= 0.6  # one core spinning (less whatever the scheduler gave the rest of the host)
    assert "other processes kept" in disturbance({"others_cores": others})
    assert disturbance({"others_cores": 0.1}) is None
