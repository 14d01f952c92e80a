"""A worker started with --quantization int8 says so: /info (with its weight bytes and a note that outputs are not
bit-identical to the unquantized model), /health (what the control plane keeps), tandem_worker_info and
tandem_model_weight_bytes; it serves tokens; an unknown quantization stops it at once naming the flag."""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, START_TIMEOUT_S, generate, metric, start_worker, token_ids
from tests.procs import ROOT, wait_http

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    started = {}
    try:
        started["int8"] = start_worker("int8", "colocated", tiny_model_dir, log_dir, "--quantization", "int8",
                                       wait=False)
        started["plain"] = start_worker("plain", "colocated", tiny_model_dir, log_dir, wait=False)
        for proc in started.values():
            wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _get(url: str, path: str) -> dict:
    r = requests.get(url + path, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_info_says_int8_with_its_weight_bytes_and_that_outputs_are_not_bit_identical(workers):
    int8, plain = _get(workers["int8"].url, "/info"), _get(workers["plain"].url, "/info")
    assert (int8["quantization"], plain["quantization"]) == ("int8", "none")
    # A quarter of float32's, or half where a colocated worker of a CPU with VNNI holds the matrix for both kernels.
    both = "fbgemm's int8 GEMM for long ones" in int8["matvec"]["reason"]
    assert 0 < int8["weight_bytes"] <= (0.55 if both else 0.3) * plain["weight_bytes"]
    assert int8["bit_identical"] is False and "not bit-identical" in int8["note"]
    assert plain["bit_identical"] is True and "note" not in plain
    health = _get(workers["int8"].url, "/health")
    assert (health["quantization"], health["weight_bytes"]) == ("int8", int8["weight_bytes"])


def test_metrics_carry_the_quantization_and_the_weight_bytes(workers):
    url = workers["int8"].url
    weight_bytes = _get(url, "/info")["weight_bytes"]
    assert metric(url, "tandem_worker_info", quantization="int8", dtype="float32") == 1
    assert metric(url, "tandem_worker_info", quantization="none") == 0
    assert metric(url, "tandem_model_weight_bytes", role="colocated") == weight_bytes
    assert metric(workers["plain"].url, "tandem_worker_info", quantization="none") == 1


def test_the_int8_worker_generates(workers):
    events = generate(workers["int8"].url, prompt="The quick brown fox", max_tokens=5, ignore_eos=True)
    assert len(token_ids(events)) == 5 and events[-1]["finish_reason"] == "length"


def test_an_unknown_quantization_exits_2_naming_the_flag_and_the_choices(tiny_model_dir):
    result = subprocess.run([sys.executable, "-m", "inference.worker", "--role", "colocated", "--model",
                             str(tiny_model_dir), "--port", "1", "--quantization", "int4"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--quantization" in result.stderr and "'int4'" in result.stderr and "int8" in result.stderr
