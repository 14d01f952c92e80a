"""A worker says on /info how its float weights lie in memory (--weight-layout; which one auto picks:
tests/inference/engine/test_weight_layout.py), who multiplies its decode steps' tokens by them (--matvec: Tandem's
kernel or torch's matmul, tests/inference/engine/test_matvec.py), where its C kernels came from (built at install),
and how many tensor ops one single-stream decode step runs; all serve the same greedy tokens; a bad --weight-layout or --matvec stops it at once naming the flag."""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.inference.worker.inprocess import InProcessWorker
from tests.inference.worker.support import HTTP_TIMEOUT_S, generate, metric, token_ids
from tests.procs import ROOT

WORKER_ARGS = ("--role", "colocated", "--threads", "1", "--kv-cache-bytes", "8M", "--dtype", "float32")


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    started = {}
    try:
        for name, extra in (("auto", ()), ("transposed", ("--weight-layout", "transposed")),
                            ("as_loaded", ("--weight-layout", "as_loaded"))):
            started[name] = InProcessWorker(*WORKER_ARGS, "--model", str(tiny_model_dir), *extra).start()
        for proc in started.values():
            proc.wait_ready()
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _info(proc) -> dict:
    r = requests.get(f"{proc.url}/info", timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_info_reports_the_weight_layout_and_the_matvec_kernel_with_their_reasons_and_the_decode_step_ops(workers):
    auto, transposed = _info(workers["auto"]), _info(workers["transposed"])
    as_loaded = _info(workers["as_loaded"])
    # Tandem's kernel (every CI CPU has AVX2 and FMA) reads the weights as loaded.
    assert auto["matvec"]["setting"] == "auto" and auto["matvec"]["kernel"] == "tandem"
    assert auto["matvec"]["isa"] in ("avx2+fma", "avx512f") and auto["matvec"]["isa"] in auto["matvec"]["reason"]
    assert auto["weight_layout"]["setting"] == "auto" and auto["weight_layout"]["layout"] == "as_loaded"
    assert "matvec kernel" in auto["weight_layout"]["reason"]
    assert transposed["weight_layout"] == {"setting": "transposed", "layout": "transposed", "reason": "asked for"}
    assert transposed["matvec"]["kernel"] == "torch" and "transposed" in transposed["matvec"]["reason"]
    assert as_loaded["weight_layout"] == {"setting": "as_loaded", "layout": "as_loaded", "reason": "asked for"}
    assert as_loaded["matvec"]["kernel"] == "tandem"
    assert 0 < transposed["decode_step_ops"] and 0 < as_loaded["decode_step_ops"] == auto["decode_step_ops"]


def test_info_and_metrics_say_the_kernels_were_built_at_install(workers):
    """make setup installs the project, which builds the kernels (a worker compiling one itself says first_use)."""
    url = workers["auto"].url
    kernels = _info(workers["auto"])["kernels"]
    assert set(kernels) == {"matvec", "int8_matvec", "paged_attention", "prefill_attention", "decode_layers"}
    assert kernels["matvec"]["origin"] == "installed" and "/_built/matvec-" in kernels["matvec"]["path"]
    assert metric(url, "tandem_worker_kernel", kernel="matvec", origin="installed") == 1
    assert metric(url, "tandem_worker_kernel", kernel="matvec", origin="first_use") == 0


def test_every_layout_and_kernel_serves_the_same_greedy_tokens(workers):
    outputs = [token_ids(generate(proc.url, prompt="the weights lie transposed in memory", max_tokens=24,
                                  temperature=0, ignore_eos=True)) for proc in workers.values()]
    assert len(outputs[0]) == 24 and outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("flag", ["--weight-layout", "--matvec"])
def test_an_unknown_choice_exits_2_naming_the_flag(tiny_model_dir, flag):
    result = subprocess.run([sys.executable, "-m", "inference.worker", "--role", "decode", "--model",
                             str(tiny_model_dir), "--port", "1", flag, "columns"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert flag in result.stderr, result.stderr
