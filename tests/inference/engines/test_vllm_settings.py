"""A vLLM revision's settings: the Tandem settings that mean the same to vLLM become its flags and environment, the
ones it has no meaning for are refused by name, and arguments Tandem sets itself cannot be overridden."""
from __future__ import annotations

import pytest

from inference.engines.vllm.launch import LaunchSpec, command
from inference.engines.vllm.settings import VllmSettingsError, check_part, flags_and_env


def test_mapped_settings_become_vllm_flags_and_cpu_environment():
    settings = check_part({"engine": "vllm", "max_num_seqs": 16, "max_model_len": 2048, "block_size": 32,
                           "prefix_caching": False, "chunked_prefill": True, "compile": False,
                           "kv_cache_bytes": (3 << 30) + 1, "threads": 2, "drain_timeout": 8,
                           "extra_args": ["--max-logprobs", "5"]}, where="common")
    flags, env = flags_and_env(settings, dtype="bfloat16", on_gpu=False)
    assert flags == ["--dtype", "bfloat16", "--max-num-seqs", "16", "--max-model-len", "2048", "--block-size", "32",
                     "--shutdown-timeout", "8", "--no-enable-prefix-caching", "--enable-chunked-prefill",
                     "--enforce-eager", "--max-logprobs", "5"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # whole GiB, rounded up


def test_on_a_gpu_the_kv_budget_is_vllms_own_flags():
    flags, env = flags_and_env({"kv_cache_bytes": 1 << 30, "kv_memory_fraction": 0.85}, dtype="auto", on_gpu=True)
    assert flags == ["--dtype", "auto", "--kv-cache-memory-bytes", str(1 << 30), "--gpu-memory-utilization", "0.85"]
    assert env == {}


@pytest.mark.parametrize("part, key, words", [
    ({"speculative": {"method": "ngram"}}, "speculative", "has no meaning for a vLLM worker"),
    ({"max_queue": 4}, "max_queue", "has no meaning for a vLLM worker"),
    ({"block_size": 24}, "block_size", "multiple of 16"),
    ({"max_num_seqs": True}, "max_num_seqs", "must be an integer"),
    ({"cpu_bind": "all"}, "cpu_bind", "nobind, auto, or CPU ids"),
    ({"extra_args": "--enable-lora"}, "extra_args", "must be a list of strings"),
    ({"extra_args": ["--api-key=x"]}, "extra_args", "sets --api-key, which Tandem sets itself"),
    ({"extra_args": ["--served_model_name", "x"]}, "extra_args", "sets --served-model-name"),
])
def test_a_setting_vllm_cannot_take_is_refused_by_name(part, key, words):
    with pytest.raises(VllmSettingsError, match=words) as caught:
        check_part(part, where="common")
    assert caught.value.key == key


def test_the_engine_is_named_in_common_only():
    with pytest.raises(VllmSettingsError, match="belongs in common"):
        check_part({"engine": "vllm"}, where="colocated")


def test_the_launch_keeps_the_secret_off_the_command_line_and_serves_the_deployments_name():
    argv, env = command(LaunchSpec(python="/v/bin/python", model_path="/m", served_name="demo", host="127.0.0.1",
                                   port=8100, dtype="float32", settings={"max_num_seqs": 4}, secret="s3cret"))
    assert argv == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                    "--served-model-name", "demo", "--host", "127.0.0.1", "--port", "8100", "--dtype", "float32",
                    "--max-num-seqs", "4"]
    assert "s3cret" not in " ".join(argv) and env["VLLM_API_KEY"] == "s3cret"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
