"""A CPU worker on a node that has measured its host gets its share of the host's roofline as flags (one thread's
figures times its threads, at most the whole host's), which the worker parses; without figures, or on a GPU, none."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.models import Revision, Worker
from inference.worker.config import parse_args

pytestmark = pytest.mark.django_db

ROOFLINE = {"source": "measured", "one_thread": {"threads": 1, "matmul_gflops": {"float32": 50.0, "int8": 100.0},
                                                 "read_gbs": 10.0},
            "all_cores": {"threads": 4, "matmul_gflops": {"float32": 150.0, "int8": 400.0}, "read_gbs": 25.0}}


def _argv(deployment, node, engine_settings) -> list[str]:
    revision = Revision.objects.create(deployment=deployment, number=deployment.revisions.count() + 1,
                                       model_path=deployment.current_revision.model_path,
                                       engine_settings=engine_settings)
    argv = launch.argv_for(Worker(deployment=deployment, role="prefill", node=node, id=99, revision=revision), 1234)
    return argv[argv.index("inference.worker") + 1:]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_worker_gets_its_threads_share_of_the_hosts_roofline(deployment, online_node):
    online_node.roofline = ROOFLINE
    online_node.save(update_fields=["roofline"])
    argv = _argv(deployment, online_node, {"threads": 2})
    assert _flag(argv, "--host-peak-gflops") == "float32=100,int8=200"
    assert _flag(argv, "--host-bandwidth-gbs") == "20"
    config = parse_args(argv)
    assert config.host_peak_gflops == {"float32": 100.0, "int8": 200.0} and config.host_bandwidth_gbs == 20.0
    argv = _argv(deployment, online_node, {"threads": 16})
    assert _flag(argv, "--host-peak-gflops") == "float32=150,int8=400"


def test_a_node_that_has_not_measured_passes_no_figures(deployment, online_node):
    argv = _argv(deployment, online_node, {})
    assert "--host-peak-gflops" not in argv and "--host-bandwidth-gbs" not in argv
    assert parse_args(argv).host_peak_gflops is None


def test_a_worker_on_a_gpu_gets_no_cpu_figures(deployment, online_node):
    online_node.roofline = ROOFLINE
    online_node.save(update_fields=["roofline"])
    assert "--host-peak-gflops" not in _argv(deployment, online_node, {"device": "cuda"})
