"""make run saves SmolLM2 in the dtype `auto` runs on this host, so that both demo workers map one copy of the
weights: bfloat16 where the CPU computes it natively, float32 (a folder of its own) elsewhere."""
from __future__ import annotations

import pytest

from controlplane.run import demo
from inference import hardware


@pytest.mark.parametrize("flags, folder, dtype", [
    ({"avx2", "fma", "avx512f", "avx512_bf16"}, "smollm2-135m", "bfloat16"),
    ({"amx_tile", "amx_bf16"}, "smollm2-135m", "bfloat16"),
    ({"avx2", "fma"}, "smollm2-135m-float32", "float32"),
])
def test_smollm2_is_saved_in_the_dtype_this_cpu_runs_fastest(monkeypatch, settings, tmp_path, flags, folder, dtype):
    settings.TANDEM_MODELS_DIR = tmp_path
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    assert demo.model_target("smollm2") == (tmp_path / folder, ["--dtype", dtype])


def test_the_tiny_model_has_one_dtype_everywhere(monkeypatch, settings, tmp_path):
    settings.TANDEM_MODELS_DIR = tmp_path
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))
    assert demo.model_target("tiny") == (tmp_path / "tiny", [])
