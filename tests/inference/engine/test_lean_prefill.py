"""Prefill steps run the lean forward (lean_decode.py) too: whole prompts, packed prompts and chunks over a cached
prefix compute bit for bit what the reference forward computes (float32, bfloat16, INT8), greedy output stays
token-identical (Llama, Qwen2, Mistral), and a chunk's attention over the cache equals attention over K/V repeated per
query head."""

import pytest
import torch
import torch.nn.functional as F
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.attention import PrefillAttention
from inference.engine.step_ops import CountOps
from tests.inference.engine.support import random_prompts, save_random_model

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def engine(model_dir, **settings) -> LLMEngine:
    # torch's matmul on both sides: this is about the lean forward's exactness (Tandem's kernel: test_matvec.py)
    return LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=1 << 20, prefix_caching=False,
                            **{"matvec": "torch", **settings}))


def next_prefill_inputs(eng: LLMEngine, prompts: list[list[int]]):
    """The prepared inputs of the engine's next prefill step after adding `prompts`."""
    for i, prompt in enumerate(prompts):
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    seqs, is_prefill = eng.scheduler.schedule()
    assert is_prefill
    return seqs, eng.model_runner._prepare(seqs, [])


def both_forwards(eng: LLMEngine, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    runner = eng.model_runner
    with torch.inference_mode():  # both write the same K/V of the step's tokens
        return runner._forward(*inputs), runner.lean_decoder.forward(*inputs)


@pytest.mark.parametrize("settings", [{"dtype": "float32"}, {"dtype": "bfloat16"},
                                      {"dtype": "float32", "quantization": "int8"}],
                         ids=["float32", "bfloat16", "int8"])
def test_a_lean_prefill_step_equals_the_reference_step_bit_for_bit(tiny_model_dir, settings):
    eng = engine(tiny_model_dir, chunked_prefill=False, **settings)
    seqs, inputs = next_prefill_inputs(eng, random_prompts([7, 30, 61], seed=4))
    assert len(seqs) == 3
    reference, lean = both_forwards(eng, inputs)
    assert reference.shape == (98, eng.model_runner.model.config.hidden_size)
    assert torch.equal(reference, lean)


def test_a_chunk_over_a_cached_prefix_equals_the_reference_bit_for_bit(tiny_model_dir):
    eng = engine(tiny_model_dir, prefill_chunk_size=16, prefill_chunk_size_alone=16, dtype="float32")
    eng.add_request("r0", random_prompts([50], seed=6)[0], SamplingParams(max_tokens=4, ignore_eos=True))
    eng.step()  # the first chunk, positions [0, 16)
    seqs, is_prefill = eng.scheduler.schedule()
    assert is_prefill and seqs[0].num_cached_tokens == 16
    reference, lean = both_forwards(eng, eng.model_runner._prepare(seqs, []))
    assert reference.shape[0] == 16 and torch.equal(reference, lean)


@pytest.mark.parametrize("settings", [{"chunked_prefill": False}, {"prefill_chunk_size": 16}],
                         ids=["one_pass", "chunked"])
def test_float32_greedy_output_is_token_identical_with_and_without_the_lean_prefill(tiny_model_dir, settings):
    prompts = random_prompts([3, 17, 40, 70], seed=8)
    lean, plain = engine(tiny_model_dir, **settings), engine(tiny_model_dir, lean_prefill=False, **settings)
    assert lean.generate(prompts, GREEDY) == plain.generate(prompts, GREEDY)


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_qwen2_and_mistral_prefill_token_identically_on_the_lean_path(tiny_model_dir, tmp_path, config_cls,
                                                                     model_cls):
    save_random_model(config_cls, model_cls, tmp_path, tiny_model_dir)
    prompts = random_prompts([5, 21, 40], seed=1)
    lean, plain = engine(tmp_path, prefill_chunk_size=16), engine(tmp_path, prefill_chunk_size=16, lean_prefill=False)
    assert lean.generate(prompts, GREEDY) == plain.generate(prompts, GREEDY)
    _, inputs = next_prefill_inputs(engine(tmp_path, chunked_prefill=False), prompts)
    reference, lean_hidden = both_forwards(lean, inputs)
    assert torch.equal(reference, lean_hidden)


def test_a_prefill_step_runs_the_lean_forward(tiny_model_dir):
    counts = {}
    for lean in (False, True):
        eng = engine(tiny_model_dir, lean_prefill=lean)
        eng.add_request("r0", random_prompts([30], seed=2)[0], SamplingParams(max_tokens=2, ignore_eos=True))
        with CountOps() as count:
            eng.step()  # the whole prompt's prefill
        counts[lean] = count.num_ops
    assert counts[True] < 0.8 * counts[False], counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_attention_equals_attention_over_kv_repeated_per_query_head(dtype):
    torch.manual_seed(0)
    num_layers, num_blocks, block_size, h_kv, h_q, d = 2, 8, 16, 3, 9, 32
    k_cache = torch.randn(num_layers, num_blocks, block_size, h_kv, d, dtype=dtype)
    v_cache = torch.randn(num_layers, num_blocks, block_size, h_kv, d, dtype=dtype)
    start, end = 40, 72  # a 32-token chunk after 40 cached tokens, in scattered blocks
    slots = torch.tensor([b * block_size + i for b in (5, 2, 7, 0, 3) for i in range(block_size)][:end])
    keys, queries = torch.arange(end), torch.arange(start, end)
    mask = (keys.unsqueeze(0) <= queries.unsqueeze(1)).view(1, 1, end - start, end)
    q = torch.randn(end - start, h_q, d, dtype=dtype)
    attention = PrefillAttention(k_cache, v_cache, [(0, end - start)], [(slots, mask)])
    unused = torch.zeros(end - start, h_kv, d, dtype=dtype)  # this chunk's own K/V: read back from the cache
    out = attention(1, q, unused, unused, scale=d ** -0.5)  # [C, Hq, D]
    # Hugging Face's eager reading: K/V of head h // G for query head h, a boolean causal mask.
    k = k_cache[1].view(-1, h_kv, d)[slots].transpose(0, 1).repeat_interleave(h_q // h_kv, 0).unsqueeze(0)
    v = v_cache[1].view(-1, h_kv, d)[slots].transpose(0, 1).repeat_interleave(h_q // h_kv, 0).unsqueeze(0)
    expected = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask,
                                              scale=d ** -0.5)[0].transpose(0, 1)
    assert out.shape == (end - start, h_q, d)
    assert torch.equal(out, expected)
