"""The engine runs the dtype it is asked for; `auto` is the model config's own where the device computes it natively,
float32 otherwise; float16 on a CPU without fast float16 is refused unless forced. The CPU's flags are set by each
test that depends on them, so the verdicts hold on every CPU (AVX2 only, AVX512-BF16, AMX)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine import precision


def _variant(tiny_model_dir, tmp_path, **config_changes):
    """The tiny model with its config.json's dtype fields replaced (None: removed); the weights stay float32."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in config_changes.items():
        config.pop(key, None)
        if value is not None:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


WITH_BF16 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: WITH_BF16)


def _engine(model, **kwargs) -> LLMEngine:
    return LLMEngine(Config(model=model, threads=1, kv_cache_bytes=1 << 20, **kwargs))


def test_auto_is_the_default_and_runs_the_dtype_the_model_config_names(tiny_model_dir, tmp_path, cpu_with_bf16):
    assert Config(model=tiny_model_dir).dtype == "auto"
    assert _engine(tiny_model_dir).dtype == "float32"  # the tiny model is saved in float32
    engine = _engine(_variant(tiny_model_dir, tmp_path, dtype="bfloat16"))
    assert engine.dtype == engine.kv_layout["dtype"] == "bfloat16"
    assert engine.model_runner.k_cache.dtype == engine.model_runner.model.dtype == torch.bfloat16
    assert engine.dtype_reason == "auto: the model's own dtype, native on this cpu (avx512_bf16)"


def test_auto_runs_a_bfloat16_model_in_float32_on_a_cpu_without_bfloat16_arithmetic(tiny_model_dir, tmp_path,
                                                                                    monkeypatch, caplog):
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2_ONLY)
    engine = _engine(_variant(tiny_model_dir, tmp_path, dtype="bfloat16"))
    assert engine.dtype == engine.kv_layout["dtype"] == "float32"
    assert engine.model_runner.k_cache.dtype == engine.model_runner.model.dtype == torch.float32
    assert "no bfloat16 arithmetic (AVX512-BF16, AMX-BF16 or Arm BF16): float32" in engine.dtype_reason
    assert engine.dtype_reason in caplog.text


def test_an_explicit_bfloat16_runs_without_bfloat16_arithmetic_and_says_what_it_costs(tiny_model_dir, monkeypatch,
                                                                                      caplog):
    monkeypatch.setattr(precision, "cpu_flags", lambda: AVX2_ONLY)
    engine = _engine(tiny_model_dir, dtype="bfloat16")
    assert engine.dtype == "bfloat16" and engine.dtype_reason.startswith("asked for; this CPU has no bfloat16")
    assert "dtype auto would pick float32 here" in caplog.text


@pytest.mark.parametrize("flags, native", [({"avx512f", "avx512_bf16"}, True), ({"amx_tile", "amx_bf16"}, True),
                                           ({"fp", "asimd", "bf16"}, True), ({"avx2", "fma", "avx512f"}, False),
                                           (set(), False)])
def test_native_bfloat16_is_read_from_the_cpu_flags(monkeypatch, flags, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    assert precision.has_native_bfloat16(torch.device("cpu")) is native


@pytest.mark.parametrize("capability, native", [((8, 0), True), ((9, 0), True), ((7, 5), False)])
def test_native_bfloat16_on_cuda_is_compute_capability_8_or_more(monkeypatch, capability, native):
    """Mocked: this host has no GPU."""
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda device=None: capability)
    assert precision.has_native_bfloat16(torch.device("cuda")) is native


def test_auto_reads_torch_dtype_from_folders_saved_by_older_transformers(tiny_model_dir, tmp_path, cpu_with_bf16):
    model = _variant(tiny_model_dir, tmp_path, dtype=None, torch_dtype="bfloat16")
    assert precision.resolve_dtype("auto", model, torch.device("cpu")) == "bfloat16"


@pytest.mark.parametrize("named", [None, "float64", "int8"])
def test_auto_is_float32_when_the_config_names_no_dtype_the_engine_runs(tiny_model_dir, tmp_path, named):
    model = _variant(tiny_model_dir, tmp_path, dtype=named, torch_dtype=None)
    assert precision.resolve_dtype("auto", model, torch.device("cpu")) == "float32"


def test_an_explicit_dtype_wins_over_the_model_config(tiny_model_dir, tmp_path, cpu_with_bf16):
    engine = _engine(_variant(tiny_model_dir, tmp_path, dtype="bfloat16"), dtype="float32")
    assert engine.dtype == engine.kv_layout["dtype"] == "float32"
    assert engine.model_runner.k_cache.dtype == torch.float32


def test_float16_on_a_cpu_without_fast_float16_is_refused_naming_the_alternatives(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_float16", lambda: False)
    with pytest.raises(precision.SlowDtypeError, match="dtype float16 would crawl on this CPU") as refused:
        _engine(tiny_model_dir, dtype="float16")
    for alternative in ("bfloat16", "float32", "auto", "--allow-slow-float16"):
        assert alternative in str(refused.value)


def test_allow_slow_float16_runs_float16_anyway(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_float16", lambda: False)
    engine = _engine(tiny_model_dir, dtype="float16", allow_slow_float16=True)
    assert engine.dtype == "float16" and engine.model_runner.k_cache.dtype == torch.float16


def test_auto_runs_a_float16_model_in_float32_on_a_cpu_without_fast_float16(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_float16", lambda: False)
    model = _variant(tiny_model_dir, tmp_path, dtype="float16")
    assert precision.resolve_dtype("auto", model, torch.device("cpu")) == "float32"
    monkeypatch.setattr(precision, "cpu_has_fast_float16", lambda: True)
    assert precision.resolve_dtype("auto", model, torch.device("cpu")) == "float16"


@pytest.mark.parametrize("flags, fast", [({"avx512f", "avx512_bf16"}, False), ({"avx512f", "avx512_fp16"}, True),
                                         ({"amx_tile", "amx_fp16"}, True), ({"fp", "asimd", "asimdhp"}, True),
                                         (set(), False)])
def test_fast_float16_is_read_from_the_cpu_flags(monkeypatch, flags, fast):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision.platform, "system", lambda: "Linux")
    assert precision.cpu_has_fast_float16() is fast


def test_a_bad_allow_slow_float16_value_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="allow_slow_float16 must be true or false"):
        Config(model=tiny_model_dir, allow_slow_float16="yes")


def test_auto_with_int8_weights_runs_float32_activations_over_the_models_own_kv_dtype(tiny_model_dir, tmp_path,
                                                                                      cpu_with_bf16):
    """INT8's kernel reads float32: `auto` beside INT8 weights on a CPU runs float32 activations, and keeps the KV
    cache in the model's own dtype, so that a prefill worker without INT8 hands its K/V over unchanged."""
    model = _variant(tiny_model_dir, tmp_path, dtype="bfloat16")
    decode = _engine(model, role="decode", quantization="int8", matvec="tandem")
    prefill = _engine(model, role="prefill")
    assert decode.dtype == "float32" and "INT8" in decode.model_runner.dtype_reason
    assert decode.kv_layout == prefill.kv_layout and prefill.kv_layout["dtype"] == "bfloat16"
    assert decode.model_runner.k_cache.dtype == torch.bfloat16
    colocated = _engine(model, quantization="int8", matvec="tandem")
    outputs = colocated.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outputs[0]) == 4
    asked = _engine(model, dtype="bfloat16", quantization="int8", matvec="tandem")  # an explicit dtype wins
    assert asked.dtype == asked.kv_layout["dtype"] == "bfloat16"
