"""Prompt rows through the layers in one C call (inference/engine/kernels/decode_layers.c): a mixed step (a few prompt
tokens beside the decodes, a prompt's first chunk or one after its cached prefix) and a short prompt alone compute the
lean forward's hidden states and cache, an engine serves the same greedy tokens with and without it (the tiny model,
SmolLM2 in float32), and a step whose prompt rows the prefill kernel does not run keeps the lean forward."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.kernels import decode_layers, matvec, prefill_attention
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import prefilled, random_prompts

pytestmark = pytest.mark.skipif(matvec.load()[0] is None or decode_layers.load()[0] is None
                                or prefill_attention.load_kernel()[0] is None,
                                reason="Tandem's kernels unavailable here")

SETTINGS = {"float32": {"dtype": "float32"}, "int8": {"dtype": "float32", "quantization": "int8", "matvec": "tandem"}}
NUM_DECODES, NUM_PROMPT_TOKENS = 5, 6


def engine(model_dir, **settings) -> LLMEngine:
    # the chunk beside decodes counts the decodes' tokens: NUM_PROMPT_TOKENS prompt tokens beside NUM_DECODES
    settings = {"prefill_chunk_size": NUM_DECODES + NUM_PROMPT_TOKENS, "prefill_chunk_size_alone": 64,
                "kv_cache_bytes": 4 << 20, **settings}
    return LLMEngine(Config(model=model_dir, threads=1, prefix_caching=False, **settings))


def mixed_step(eng: LLMEngine, prompt_len: int = 20):
    """The engine's next step: NUM_DECODES decodes beside a chunk of a waiting prompt (prefill chunks first)."""
    prefilled(eng, random_prompts([5, 19, 40, 7, 12], seed=3))
    eng.add_request("late", random_prompts([prompt_len], seed=9)[0], SamplingParams(max_tokens=4, ignore_eos=True))
    seqs, is_prefill = eng.scheduler.schedule()
    assert is_prefill and seqs[0].num_scheduled_tokens == NUM_PROMPT_TOKENS and len(seqs) == NUM_DECODES + 1
    return seqs


def both_ways(eng: LLMEngine, seqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(lean hidden, fused hidden, K cache after each, the C calls' prompt chunks) of the same step's forward."""
    runner = eng.model_runner
    decoder, fused = runner.lean_decoder, runner.lean_decoder.fused
    num_prefill = sum(seq.is_prefilling for seq in seqs)
    calls = []
    with torch.inference_mode():
        inputs = runner._prepare(seqs[:num_prefill], seqs[num_prefill:])
        decoder.fused = None
        try:
            lean = decoder.forward(*inputs)
        finally:
            decoder.fused = fused
        k_lean = runner.k_cache.clone()
        real = fused._call
        fused._call = lambda *args: calls.append(args[11]) or real(*args)  # num_chunks
        try:
            hidden = decoder.forward(*inputs)
        finally:
            fused._call = real
    return lean, hidden, k_lean, runner.k_cache.clone(), calls


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return bool((a.float() - b.float()).abs().max() <= tolerance * b.float().abs().max())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_mixed_step_computes_the_lean_steps_hidden_states_and_cache(tiny_model_dir, name):
    eng = engine(tiny_model_dir, **SETTINGS[name])
    assert "prompt tokens" in eng.matvec["fused_decode"], eng.matvec["fused_decode"]
    seqs = mixed_step(eng)
    lean, fused, k_lean, k_fused, calls = both_ways(eng, seqs)
    assert calls == [1], "the mixed step ran in one C call, its prompt rows as one chunk"
    assert fused.shape == lean.shape == (NUM_PROMPT_TOKENS + NUM_DECODES, eng.model_runner.model.config.hidden_size)
    assert close(fused, lean, 1e-5 if name == "float32" else 1e-3)
    assert close(k_fused, k_lean, 1e-5 if name == "float32" else 1e-3)


def test_a_chunk_after_its_cached_prefix_reads_it_from_the_cache(tiny_model_dir):
    eng = engine(tiny_model_dir, dtype="float32")
    seqs = mixed_step(eng)
    eng.model_runner.run(seqs, True)
    eng.scheduler.postprocess(seqs, [None] + [0] * NUM_DECODES, True)
    seqs, _ = eng.scheduler.schedule()
    assert seqs[0].num_cached_tokens == NUM_PROMPT_TOKENS, "the prompt's second chunk"
    lean, fused, _, _, calls = both_ways(eng, seqs)
    assert calls == [1] and close(fused, lean, 1e-5)


def test_a_short_prompt_alone_runs_in_one_call(tiny_model_dir):
    eng = engine(tiny_model_dir, dtype="float32")
    eng.add_request("alone", random_prompts([9], seed=4)[0], SamplingParams(max_tokens=1))
    seqs, is_prefill = eng.scheduler.schedule()
    assert is_prefill and len(seqs) == 1
    lean, fused, k_lean, k_fused, calls = both_ways(eng, seqs)
    assert calls == [1] and close(fused, lean, 1e-5) and close(k_fused, k_lean, 1e-5)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_an_engine_serves_the_same_greedy_tokens_with_and_without_fused_mixed_steps(tiny_model_dir, name):
    prompts = random_prompts([3, 17, 33, 64, 9, 21, 5], seed=11)  # chunks of a few tokens beside the decodes
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs = [engine(tiny_model_dir, fused_decode=on, **SETTINGS[name]).generate(prompts, greedy)
               for on in (True, False)]
    assert outputs[0] == outputs[1]


@pytest.mark.skipif(not (MODELS_DIR / "smollm2-135m" / "config.json").is_file(), reason="SmolLM2 is not prepared")
def test_smollm2_float32_greedy_tokens_are_the_same_with_and_without_fused_mixed_steps():
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * k for k in (1, 3, 2, 5)] + random_prompts([40, 70], seed=5)
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs = [engine(MODELS_DIR / "smollm2-135m", dtype="float32", kv_cache_bytes=32 << 20,
                      fused_decode=on).generate(prompts, greedy) for on in (True, False)]
    assert outputs[0] == outputs[1]


def test_prompt_rows_the_prefill_kernel_does_not_run_keep_the_lean_forward(tiny_model_dir):
    # a KV cache narrower than the model: the prefill kernel would read the chunk's own K/V rounded
    narrow = engine(tiny_model_dir, dtype="float32", kv_cache_dtype="float16")
    assert narrow.matvec["fused_decode"].startswith("on: decode steps"), narrow.matvec["fused_decode"]
    *_, calls = both_ways(narrow, mixed_step(narrow))
    assert calls == []
    # torch's SDPA for the prompt rows (a plan without the prefill kernel), the decode steps still fused
    eng = engine(tiny_model_dir, dtype="float32")
    eng.model_runner.plan = replace(eng.model_runner.plan, prefill_attention=None)
    *_, calls = both_ways(eng, mixed_step(eng))
    assert calls == []
