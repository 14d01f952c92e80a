"""Sampling: seeds reproduce, top-k=1 and a tiny top-p are greedy, top-k keeps to the k best tokens."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import random_prompts


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20))


PROMPT = random_prompts([15], seed=7)[0]
OTHERS = random_prompts([4, 30, 11], seed=8)
HOT = dict(max_tokens=16, temperature=1.5, ignore_eos=True)


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(engine):
    alone = engine.generate([PROMPT], SamplingParams(seed=42, **HOT))[0]
    again = engine.generate([PROMPT], SamplingParams(seed=42, **HOT))[0]
    in_batch = engine.generate(OTHERS + [PROMPT], [SamplingParams(**HOT)] * 3 + [SamplingParams(seed=42, **HOT)])[-1]
    assert alone == again == in_batch


def test_different_seeds_give_different_samples(engine):
    samples = {tuple(engine.generate([PROMPT], SamplingParams(seed=seed, **HOT))[0]) for seed in range(4)}
    assert len(samples) > 1


def test_top_k_one_and_a_tiny_top_p_are_greedy(engine):
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert engine.generate([PROMPT], SamplingParams(top_k=1, **HOT))[0] == greedy
    assert engine.generate([PROMPT], SamplingParams(top_p=1e-6, **HOT))[0] == greedy
    assert engine.generate([PROMPT], SamplingParams(temperature=1e-4, max_tokens=16, ignore_eos=True))[0] == greedy


def test_top_k_samples_only_among_the_k_most_likely_tokens(engine, tiny_model_dir):
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    top_k = 3
    outputs = engine.generate([PROMPT] * 4, [SamplingParams(top_k=top_k, seed=s, temperature=5.0, max_tokens=16,
                                                            ignore_eos=True) for s in range(4)])
    picked_below_top1 = 0
    for output in outputs:
        with torch.inference_mode():
            logits = hf(torch.tensor([PROMPT + output])).logits[0, len(PROMPT) - 1:-1]  # [n, V]
        allowed = logits.topk(top_k, dim=-1).indices  # [n, k]
        chosen = torch.tensor(output).unsqueeze(1)  # [n, 1]
        assert (allowed == chosen).any(dim=1).all(), "a token outside the top-k was sampled"
        picked_below_top1 += int((allowed[:, 0] != chosen[:, 0]).sum())
    assert picked_below_top1 > 0, "a hot top-k sampler never left the top token: it is not sampling"


def test_unseeded_sampling_runs_beside_greedy_and_seeded_requests(engine):
    params = [SamplingParams(**HOT), SamplingParams(max_tokens=16), SamplingParams(seed=1, top_p=0.9, **HOT)]
    outputs = engine.generate(OTHERS, params)
    assert [len(o) for o in outputs[::2]] == [16, 16]
    assert all(0 <= t < 4096 for o in outputs for t in o)


def test_a_seeded_request_samples_the_same_tokens_disaggregated_as_colocated(engine, tiny_model_dir):
    params = SamplingParams(seed=7, top_p=0.95, top_k=50, **HOT)
    colocated = engine.generate([PROMPT], params)[0]
    prefill = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=1 << 20))
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=1 << 20))
    prefill.add_request("r", PROMPT, params)
    (out,) = prefill.step()
    decode.add_prefilled("r", PROMPT, out.new_token_ids[0], params, *out.kv)
    tokens = list(out.new_token_ids)
    while decode.has_unfinished():
        for step_out in decode.step():
            tokens += step_out.new_token_ids
    assert tokens == colocated
