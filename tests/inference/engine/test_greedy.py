"""Greedy decoding in one colocated engine equals Hugging Face's generate, token for token."""
import torch
from transformers import AutoModelForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import hf_greedy, random_prompts, teacher_forced_shortfall

PROMPT_LENGTHS = [3, 7, 15, 16, 17, 33, 90, 200]  # around block edges (16) and beyond the budget's share
NUM_NEW_TOKENS = 20


def test_eight_concurrent_prompts_of_different_lengths_match_hugging_face(tiny_model_dir, hf_model):
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20))
    prompts = random_prompts(PROMPT_LENGTHS)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    stats = engine.stats()
    assert stats["num_prefill_tokens_computed"] == sum(PROMPT_LENGTHS)
    assert stats["num_generation_tokens"] == sum(len(o) for o in outputs)
    assert stats["num_kv_blocks_used"] == 0 and not engine.has_unfinished()


def test_all_prompts_are_prefilled_in_one_step_and_decoded_in_one_batch(tiny_model_dir):
    # A chunk budget that holds all 381 prompt tokens (the CPU default of 64 would spread them over six steps).
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20, prefill_chunk_size=512))
    for i, prompt in enumerate(random_prompts(PROMPT_LENGTHS)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(engine.step()) == len(PROMPT_LENGTHS)  # one packed prefill
    assert engine.stats()["num_running"] == len(PROMPT_LENGTHS)
    assert len(engine.step()) == len(PROMPT_LENGTHS)  # one batched decode


def test_a_small_prefill_budget_splits_prefills_without_changing_outputs(tiny_model_dir, hf_model):
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20, max_num_batched_tokens=40,
                              max_num_seqs=3))
    prompts = random_prompts(PROMPT_LENGTHS, seed=1)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, 8), f"prompt of {len(prompt)} tokens"


def test_bfloat16_engine_picks_hugging_faces_top_token_within_bfloat16_precision(tiny_model_dir):
    """bf16 carries ~3 significant digits, so batched and incremental math may flip a near-tie (this prompt has one
    at its 5th token, margin 0.5 on logits of ~55, where HF's own generate and its full forward disagree). So each
    token the engine picks must be HF's bf16 argmax or within bf16 rounding of it, given the same prefix."""
    hf_bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, dtype="bfloat16", kv_cache_bytes=4 << 20))
    assert engine.kv_layout["dtype"] == "bfloat16"
    assert engine.model_runner.k_cache.dtype == torch.bfloat16
    prompts = random_prompts([12, 40], seed=2)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        assert output[0] == hf_greedy(hf_bf16, prompt, 1)[0]
        shortfall = teacher_forced_shortfall(hf_bf16, prompt, output)
        assert max(shortfall) <= 1.0, f"picked tokens fall short of the top logit by {shortfall}"


def test_decode_attention_accepts_a_non_contiguous_result_as_cuda_kernels_give_one(tiny_model_dir, hf_model,
                                                                                    monkeypatch):
    """CUDA's float32 SDPA kernels may return a non-contiguous [B, Hkv, G, D] (seen on an H200); the CPU never
    does, so the CUDA kernel's layout is stood in for here: the same values, transposed twice."""
    import torch.nn.functional as F

    from inference.engine import attention

    sdpa = F.scaled_dot_product_attention

    def non_contiguous(*args, **kwargs):
        out = sdpa(*args, **kwargs)  # [B, Hkv, G, D]
        return out.transpose(1, 2).contiguous().transpose(1, 2)  # same values, strides of a [B, G, Hkv, D] buffer

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", non_contiguous)
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20))
    prompts = random_prompts([5, 17, 40], seed=3)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=6))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, 6)
