"""A decode step's layers in one C call (inference/engine/kernels/decode_layers.c): the same hidden states and cache as the
lean forward's layer loop over the same kernels (float32 within float32 rounding, bfloat16 within one rounding, INT8
through Tandem's int8 kernel), the same greedy tokens from an engine with and without it, steps it does not take
(more tokens than the kernels take, prefill rows) left to the lean forward, and /info saying when it runs and why
not."""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.config import ConfigError
from inference.engine.kernels import decode_layers, matvec
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import prefilled, random_prompts

pytestmark = pytest.mark.skipif(matvec.load()[0] is None or decode_layers.load()[0] is None,
                                reason="Tandem's kernels unavailable here")

SETTINGS = {"float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16"},
            "int8": {"dtype": "float32", "quantization": "int8", "matvec": "tandem"}}


def engine(model_dir, **settings) -> LLMEngine:
    return LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=4 << 20, prefix_caching=False,
                            **settings))


def step_both_ways(eng: LLMEngine, seqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lean hidden, fused hidden, K cache after the lean step, K cache after the fused one) of the same step."""
    runner = eng.model_runner
    decoder, fused = runner.lean_decoder, runner.lean_decoder.fused
    calls = []
    with torch.inference_mode():
        inputs = runner._prepare([], seqs)
        decoder.fused = None
        try:
            lean = decoder.forward(*inputs)
        finally:
            decoder.fused = fused
        k_lean = runner.k_cache.clone()
        real = fused._call
        fused._call = lambda *args: calls.append(args[2]) or real(*args)
        try:
            hidden = decoder.forward(*inputs)
        finally:
            fused._call = real
    assert calls == [len(seqs)], "the fused step did not run"
    return lean, hidden, k_lean, runner.k_cache.clone()


TOLERANCES = {"float32": 1e-5, "bfloat16": 0.02, "int8": 1e-3}


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    """Within `tolerance` of the largest magnitude (the tiny random model's activations reach hundreds)."""
    return bool((a.float() - b.float()).abs().max() <= tolerance * b.float().abs().max())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_fused_step_computes_the_lean_steps_hidden_states_and_cache(tiny_model_dir, name):
    eng = engine(tiny_model_dir, **SETTINGS[name])
    assert eng.matvec["fused_decode"].startswith("on:"), eng.matvec["fused_decode"]
    seqs = prefilled(eng, random_prompts([5, 19, 40], seed=3))
    lean, fused, k_lean, k_fused = step_both_ways(eng, seqs)
    assert fused.shape == lean.shape == (3, eng.model_runner.model.config.hidden_size)
    # silu's exp from libm instead of torch's: a few float32 ulps, carried through the layers; in bfloat16 a silu
    # rounded the other way now and then moves values by bfloat16 steps; INT8: the kernel rounds each token to
    # int16 per call (and normalizes it itself where the lean forward calls F.rms_norm), so an ulp can move a
    # rounding by one int16 step
    tolerance = TOLERANCES[name]
    assert close(fused, lean, tolerance)
    # the K written (RoPE'd) equals the lean step's where their inputs did not differ yet: layer 0 exactly (the
    # same normalizing kernel call; INT8's lean forward normalizes through F.rms_norm instead)
    if name != "int8":
        assert torch.equal(k_fused[0], k_lean[0])
    assert close(k_fused, k_lean, tolerance)


@pytest.mark.skipif(not (MODELS_DIR / "smollm2-135m" / "config.json").is_file(), reason="SmolLM2 is not prepared")
def test_smollm2_bfloat16_fused_step_ropes_k_bit_for_bit_as_the_lean_step():
    """SmolLM2's head dim (64, a multiple of 32) takes the bfloat16 RoPE 16 elements at a time where the CPU has
    AVX-512 (the tiny model's 48 keeps the scalar loop): layer 0's K bit for bit as the lean step's (torch's ops), the
    hidden states within one rounding."""
    eng = LLMEngine(Config(model=MODELS_DIR / "smollm2-135m", dtype="bfloat16", threads=1, kv_cache_bytes=16 << 20,
                           prefix_caching=False))
    seqs = prefilled(eng, random_prompts([5, 19, 40, 7], seed=3))
    lean, fused, k_lean, k_fused = step_both_ways(eng, seqs)
    assert torch.equal(k_fused[0], k_lean[0])
    assert close(fused, lean, TOLERANCES["bfloat16"])


@pytest.mark.parametrize("name", list(SETTINGS))
def test_an_engine_serves_the_same_greedy_tokens_with_and_without_the_fused_step(tiny_model_dir, name):
    prompts = random_prompts([3, 17, 33, 9], seed=11)  # four sequences: steps of 1-4 tokens, every ISA fuses them
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    outputs = [engine(tiny_model_dir, fused_decode=on, **SETTINGS[name]).generate(prompts, greedy)
               for on in (True, False)]
    assert outputs[0] == outputs[1]


def test_a_step_of_more_tokens_than_the_kernels_take_runs_the_lean_forward(tiny_model_dir):
    eng = engine(tiny_model_dir, dtype="float32")
    fused = eng.model_runner.lean_decoder.fused
    limit = fused.max_tokens()
    seqs = prefilled(eng, random_prompts([4] * (limit + 1), seed=2))
    ran = []
    real = fused._call
    fused._call = lambda *args: ran.append(args[2]) or real(*args)
    try:
        eng.step()  # a decode step of limit + 1 sequences: the lean forward
        assert ran == []
        eng.abort(seqs[0].request_id)
        eng.step()  # limit sequences: fused
    finally:
        fused._call = real
    assert ran == [limit]


def test_with_avx2_steps_of_up_to_32_tokens_run_fused(tiny_model_dir):
    library = matvec.load()[0]
    widest = library.isa
    try:
        assert library.cap_isa("avx2+fma") == "avx2+fma"
        eng = engine(tiny_model_dir, dtype="float32")
        fused = eng.model_runner.lean_decoder.fused
        assert fused.max_tokens() == matvec.WIDE_MAX_TOKENS
        seqs = prefilled(eng, random_prompts([2 + i for i in range(12)], seed=4))
        lean, hidden, _, _ = step_both_ways(eng, seqs)  # 12 tokens: the AVX2 kernel's tiles
        assert close(hidden, lean, 1e-5)
    finally:
        library.cap_isa(widest)


def test_info_says_why_a_step_is_not_fused(tiny_model_dir):
    reasons = {
        "fused_decode is false": {"dtype": "float32", "fused_decode": False},
        "decode attention is torch's": {"dtype": "float32", "matvec": "torch"},
        "lean decode forward is off": {"dtype": "float32", "lean_decode": False},
    }
    for why, settings in reasons.items():
        eng = engine(tiny_model_dir, **settings)
        assert eng.matvec["fused_decode"].startswith("off:") and why in eng.matvec["fused_decode"], settings
        assert eng.model_runner.lean_decoder is None or eng.model_runner.lean_decoder.fused is None
    with pytest.raises(ConfigError, match="fused_decode"):
        Config(model=tiny_model_dir, fused_decode="yes")
