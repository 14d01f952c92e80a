"""Bad command-line values stop the worker at once with a message that names the flag (exit status 2)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.procs import ROOT


def run_worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inference.worker", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args, fragment", [
    (["--role", "router", "--model", "x", "--port", "1"], "--role"),
    (["--role", "decode", "--model", "/nonexistent/model", "--port", "1"], "--model must be a Hugging Face"),
    (["--role", "decode", "--model", "{model}", "--port", "http"], "--port"),
    (["--role", "decode", "--model", "{model}", "--port", "70000"], "--port must be in 0..65535"),
    (["--role", "decode", "--model", "{model}", "--port", "1", "--kv-cache-bytes", "lots"], "not a size"),
    (["--role", "decode", "--model", "{model}", "--port", "1", "--kv-memory-fraction", "1.5"],
     "--kv-memory-fraction must be a number in (0, 1]"),
    (["--role", "decode", "--model", "{model}", "--port", "1", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--role", "decode", "--model", "{model}", "--port", "1", "--drain-timeout", "-1"], "--drain-timeout"),
    (["--role", "decode", "--model", "{model}", "--port", "1", "--dtype", "int3"], "--dtype"),
    (["--role", "colocated", "--model", "{model}", "--port", "1", "--prefill-chunk-size", "0"],
     "--prefill-chunk-size must be a positive integer"),
    (["--role", "prefill", "--model", "{model}", "--port", "1", "--prefill-chunk-size-alone", "32"],
     "--prefill-chunk-size-alone must be an integer at least prefill_chunk_size (64)"),
    (["--model", "{model}", "--port", "1"], "--role"),
    # The worker has no fault hook to switch on: faults are injected from outside it.
    (["--role", "decode", "--model", "{model}", "--port", "1", "--enable-test-faults"], "unrecognized arguments"),
])
def test_a_bad_flag_exits_2_naming_it(tiny_model_dir, args, fragment):
    result = run_worker(*(a.replace("{model}", str(tiny_model_dir)) for a in args))
    assert result.returncode == 2
    assert fragment in result.stderr, result.stderr


def test_sizes_take_units(tiny_model_dir):
    from inference.worker.config import parse_args

    config = parse_args(["--role", "decode", "--model", str(tiny_model_dir), "--port", "0",
                         "--kv-cache-bytes", "64M", "--max-body-bytes", "2KiB"])
    assert (config.engine.kv_cache_bytes, config.max_body_bytes) == (64 << 20, 2048)


def test_the_kv_pool_defaults_to_auto(tiny_model_dir):
    from inference.worker.config import parse_args

    argv = ["--role", "decode", "--model", str(tiny_model_dir), "--port", "0"]
    assert (parse_args(argv).engine.kv_cache_bytes, parse_args(argv).engine.kv_memory_fraction) == ("auto", None)
    config = parse_args([*argv, "--kv-cache-bytes", "auto", "--kv-memory-fraction", "0.5"]).engine
    assert (config.kv_cache_bytes, config.kv_memory_fraction) == ("auto", 0.5)


def test_a_model_that_fails_to_load_exits_1_with_the_reason(tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "vocab_size": 16}')  # no weights, no tokenizer
    from tests.procs import free_port

    result = run_worker("--role", "colocated", "--model", str(broken), "--port", str(free_port()))
    assert result.returncode == 1
    assert "loading the model failed" in result.stderr


def test_dtype_defaults_to_auto_and_float16_on_a_slow_cpu_can_be_forced(tiny_model_dir):
    from inference.worker.config import parse_args

    argv = ["--role", "colocated", "--model", str(tiny_model_dir), "--port", "0"]
    assert parse_args(argv).engine.dtype == "auto" and not parse_args(argv).engine.allow_slow_float16
    forced = parse_args([*argv, "--dtype", "float16", "--allow-slow-float16"]).engine
    assert (forced.dtype, forced.allow_slow_float16) == ("float16", True)


def test_float16_on_a_cpu_without_fast_float16_exits_1_naming_the_alternatives(tiny_model_dir):
    from inference.engine.precision import cpu_has_fast_float16
    from tests.procs import free_port

    if cpu_has_fast_float16():
        pytest.skip("this CPU has fast float16: the worker runs it")
    result = run_worker("--role", "colocated", "--model", str(tiny_model_dir), "--port", str(free_port()),
                        "--dtype", "float16")
    assert result.returncode == 1
    assert "dtype float16 would crawl on this CPU" in result.stderr, result.stderr
    assert "Use dtype float32, bfloat16" in result.stderr and "or auto" in result.stderr
    assert "--allow-slow-float16" in result.stderr


def test_chunked_prefill_is_on_unless_turned_off(tiny_model_dir):
    from inference.worker.config import parse_args

    argv = ["--role", "colocated", "--model", str(tiny_model_dir), "--port", "0"]
    default = parse_args(argv).engine
    assert (default.chunked_prefill, default.prefill_chunk_size) == (True, 64)  # the CPU's default
    assert parse_args([*argv, "--no-chunked-prefill"]).engine.chunked_prefill is False
    config = parse_args([*argv, "--chunked-prefill", "--prefill-chunk-size", "64"]).engine
    assert (config.chunked_prefill, config.prefill_chunk_size) == (True, 64)
    assert (default.prefill_chunk_size_alone, config.prefill_chunk_size_alone) == (256, 256)  # 4 chunks
    assert parse_args([*argv, "--prefill-chunk-size-alone", "1024"]).engine.prefill_chunk_size_alone == 1024
