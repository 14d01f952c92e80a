"""The lean decode forward computes what the reference forward (over the Hugging Face modules) computes: bit for bit
in float32, bfloat16 and INT8 on the tiny Llama, token for token on Qwen2 (biased q/k/v) and Mistral, with far fewer
tensor ops per step."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.step_ops import CountOps
from tests.inference.engine.support import prefilled, random_prompts, save_random_model

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def engine(model_dir, **settings) -> LLMEngine:
    # torch's matmul on both sides: this is about the lean forward's exactness (Tandem's kernel: test_matvec.py)
    return LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=1 << 20, prefix_caching=False,
                            **{"matvec": "torch", **settings}))


def both_forwards(eng: LLMEngine, seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, lean) hidden states of the same decode step (both write the same K/V of its tokens)."""
    runner = eng.model_runner
    with torch.inference_mode():
        inputs = runner._prepare([], seqs)
        return runner._forward(*inputs), runner.lean_decoder.forward(*inputs)


@pytest.mark.parametrize("settings", [{"dtype": "float32"}, {"dtype": "bfloat16"},
                                      {"dtype": "float32", "quantization": "int8"}],
                         ids=["float32", "bfloat16", "int8"])
def test_a_lean_decode_step_equals_the_reference_step_bit_for_bit(tiny_model_dir, settings):
    eng = engine(tiny_model_dir, **settings)
    assert eng.model_runner.lean_decoder is not None
    seqs = prefilled(eng, random_prompts([5, 19, 40], seed=3))
    reference, lean = both_forwards(eng, seqs)
    assert reference.shape == (3, eng.model_runner.model.config.hidden_size)
    assert torch.equal(reference, lean)


def test_float32_greedy_output_is_token_identical_with_and_without_the_lean_path(tiny_model_dir):
    prompts = random_prompts([3, 17, 33, 64], seed=5)
    lean, plain = engine(tiny_model_dir), engine(tiny_model_dir, lean_decode=False)
    assert lean.model_runner.lean_decoder is not None and plain.model_runner.lean_decoder is None
    assert lean.generate(prompts, GREEDY) == plain.generate(prompts, GREEDY)


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_qwen2_and_mistral_decode_token_identically_on_the_lean_path(tiny_model_dir, tmp_path, config_cls,
                                                                    model_cls):
    save_random_model(config_cls, model_cls, tmp_path, tiny_model_dir)
    prompts = random_prompts([5, 21, 40], seed=1)
    lean, plain = engine(tmp_path), engine(tmp_path, lean_decode=False)
    assert lean.generate(prompts, GREEDY) == plain.generate(prompts, GREEDY)
    reference, lean_hidden = both_forwards(lean, prefilled(lean, prompts))
    assert torch.equal(reference, lean_hidden)


def test_a_lean_decode_step_runs_far_fewer_tensor_ops(tiny_model_dir):
    counts = {}
    for lean in (False, True):
        eng = engine(tiny_model_dir, lean_decode=lean)
        prefilled(eng, random_prompts([9], seed=2))
        with CountOps() as count:
            eng.step()
        counts[lean] = count.num_ops
    assert counts[True] < 0.8 * counts[False], counts  # tiny: 222 against 295; SmolLM2 float32: 1,262 against 1,829
