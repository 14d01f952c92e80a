"""The decode levers on a float32 model keep the engine's greedy tokens: fused projections exactly (bit-identical
outputs), prepacked linears as measured here. Both apply to the reference forward (the lean decode forward fuses the
projections itself and calls the weights directly), so these engines run without it, over the weights as loaded (the
transposed layout, float32's default on a CPU, has tests of its own: test_weight_layout.py)."""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.fusion import fuse_projections, prepack_linears
from tests.inference.engine.support import random_prompts

PROMPT_LENGTHS = [5, 16, 40, 90]


def _engine(model_dir) -> LLMEngine:
    return LLMEngine(Config(model=model_dir, threads=1, dtype="float32", kv_cache_bytes=8 << 20,
                            lean_decode=False, weight_layout="as_loaded"))


def _generate(engine) -> list[list[int]]:
    return engine.generate(random_prompts(PROMPT_LENGTHS, seed=8), SamplingParams(max_tokens=16, ignore_eos=True))


@pytest.fixture(scope="module")
def plain_outputs(tiny_model_dir):
    return _generate(_engine(tiny_model_dir))


def test_fused_qkv_and_gate_up_projections_give_the_same_greedy_tokens(tiny_model_dir, plain_outputs):
    engine = _engine(tiny_model_dir)
    fuse_projections(engine.model_runner.model)
    layer = engine.model_runner.model.model.layers[0]
    assert hasattr(layer.self_attn, "qkv_proj") and hasattr(layer.mlp, "gate_up_proj")
    x = torch.randn(3, layer.self_attn.qkv_proj.in_features)
    assert torch.equal(layer.self_attn.k_proj(x), layer.self_attn.qkv_proj(x)[:, layer.self_attn.q_proj.end:
                                                                                layer.self_attn.k_proj.end])
    assert _generate(engine) == plain_outputs


def test_prepacked_linears_give_the_same_greedy_tokens(tiny_model_dir, plain_outputs):
    engine = _engine(tiny_model_dir)
    assert prepack_linears(engine.model_runner.model) == 7 * engine.model_runner.shape.num_layers
    assert _generate(engine) == plain_outputs

