"""The kernel plan (inference/engine/kernel_plan.py): decided once per runner, frozen, the source of /info's `matvec`
reasons; a decode step that was to be compiled but failed its warm-up leaves an eager plan, with the kernels an eager
engine runs."""
from __future__ import annotations

import dataclasses

import pytest

from inference.engine import Config, LLMEngine
from inference.engine import model_runner
from inference.engine.kernel_plan import KernelPlan


def _engine(model_dir, **settings) -> LLMEngine:
    return LLMEngine(Config(model=model_dir, threads=1, dtype="float32", kv_cache_bytes=1 << 20, **settings))


def test_info_reports_the_plans_choices_and_reasons(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    plan = engine.model_runner.plan
    assert isinstance(plan, KernelPlan)
    assert engine.matvec["reason"] == plan.matvec_reason and engine.matvec["setting"] == plan.setting == "auto"
    assert engine.matvec["decode_attention"] == plan.decode_attention_info
    assert engine.matvec["prefill_attention"] == plan.prefill_attention_info
    assert engine.weight_layout == {"setting": "auto", "layout": plan.weight_layout,
                                    "reason": plan.weight_layout_reason}
    assert engine.matvec["packed_weights"]["reason"] == plan.packed_weights_reason


def test_the_plan_is_frozen(tiny_model_dir):
    plan = _engine(tiny_model_dir).model_runner.plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.paged_attention = None


def test_matvec_torch_plans_no_kernel_of_tandems(tiny_model_dir):
    plan = _engine(tiny_model_dir, matvec="torch").model_runner.plan
    assert plan.matvec is None and plan.paged_attention is None and plan.prefill_attention is None
    assert plan.decode_layers is None and plan.decode_layers_reason.startswith("off:")
    assert plan.int8_kernel is None and not plan.packs_weights


def test_a_decode_step_whose_compile_fails_at_warm_up_runs_the_eager_plan(tiny_model_dir, monkeypatch):
    eager = _engine(tiny_model_dir).model_runner.plan
    failed = {"enabled": False, "backend": "inductor", "mode": None, "warmup_s": 0.1,
              "fallback": "compilation failed: a stand-in", "num_warmup_steps": 0, "pads_batch": False}
    monkeypatch.setattr("inference.engine.kernel_plan.missing_requirement", lambda device: None)
    monkeypatch.setattr(model_runner, "compile_decode", lambda forward, pool: (None, failed))
    engine = _engine(tiny_model_dir, compile=True)
    runner = engine.model_runner
    assert engine.compile_info["fallback"] == "compilation failed: a stand-in"
    assert runner.plan.compiled_decode is False and runner.can_pause
    assert engine.matvec["decode_attention"] == eager.decode_attention_info
    assert engine.matvec["fused_decode"] == eager.decode_layers_reason


def test_a_compiled_decode_step_plans_torchs_attention(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("inference.engine.kernel_plan.missing_requirement", lambda device: None)
    monkeypatch.setattr(model_runner, "compile_decode", lambda forward, pool: (forward, {"enabled": True}))
    runner = _engine(tiny_model_dir, compile=True).model_runner
    assert runner.plan.compiled_decode and runner.plan.paged_attention is None
    assert "compiled" in runner.plan.decode_attention_reason and not runner.can_pause
