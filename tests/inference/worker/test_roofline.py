"""A worker given its host's figures (--host-peak-gflops, --host-bandwidth-gbs) reports each stage's efficiency on
/metrics and /info; one given none exports no such series (a missing figure is no data, not a 0 that alerts)."""
from __future__ import annotations

import pytest
import requests

from inference.roofline import count_parameters
from tests.inference.worker.inprocess import InProcessWorker
from tests.inference.worker.support import HTTP_TIMEOUT_S, generate, metric


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    proc = InProcessWorker("--role", "colocated", "--model", str(tiny_model_dir), "--threads", "1",
                           "--kv-cache-bytes", "8M", "--dtype", "float32", "--host-peak-gflops",
                           "float32=50,int8=100", "--host-bandwidth-gbs", "10").start()
    proc.wait_ready()
    yield proc
    proc.stop()


def test_it_reports_each_stage_against_its_hosts_roofline(worker, tiny_model_dir):
    info = requests.get(f"{worker.url}/info", timeout=HTTP_TIMEOUT_S).json()
    assert info["roofline"]["prefill_efficiency"] is None  # no step yet
    generate(worker.url, prompt="the roofline of a tiny model", max_tokens=6, temperature=0)
    info = requests.get(f"{worker.url}/info", timeout=HTTP_TIMEOUT_S).json()["roofline"]
    assert info["precision"] == "float32" and info["peak_gflops"] == 50.0 and info["read_gbs"] == 10.0
    assert info["num_parameters"] == count_parameters(tiny_model_dir) > 0
    assert info["weight_bytes"] > 0
    prefill, decode = info["prefill_efficiency"], info["decode_efficiency"]
    assert 0 < prefill < 10 and 0 < decode < 10
    assert metric(worker.url, "tandem_prefill_roofline_ratio") == pytest.approx(prefill, rel=1e-3)
    assert metric(worker.url, "tandem_decode_roofline_ratio") == pytest.approx(decode, rel=1e-3)


def test_a_worker_without_host_figures_exports_no_roofline_series(tiny_model_dir):
    proc = InProcessWorker("--role", "colocated", "--model", str(tiny_model_dir), "--threads", "1",
                           "--kv-cache-bytes", "8M").start()
    try:
        proc.wait_ready()
        generate(proc.url, prompt="no figures", max_tokens=3, temperature=0)
        assert requests.get(f"{proc.url}/info", timeout=HTTP_TIMEOUT_S).json()["roofline"] is None
        body = requests.get(f"{proc.url}/metrics", timeout=HTTP_TIMEOUT_S).text
        assert "tandem_prefill_roofline_ratio{" not in body and "tandem_decode_roofline_ratio{" not in body
    finally:
        proc.stop()


def test_a_bad_figure_is_refused_naming_the_flag(capsys):
    from inference.worker.config import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args(["--role", "decode", "--model", "m", "--port", "1", "--host-peak-gflops", "float32=fast"])
    assert exit_.value.code == 2
    assert "--host-peak-gflops" in capsys.readouterr().err
