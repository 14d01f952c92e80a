"""logit_bias and presence / frequency penalties on the tiny model: they change greedy output as OpenAI defines
them (held to Hugging Face's logits, adjusted in the test), leave the other requests of a batch token-identical,
and give the same tokens colocated, prefill -> decode, resumed, and with speculation on.

The tiny model's random weights never repeat a token on their own, so the penalty tests first push one token up with
a logit bias: it repeats, and the penalties then have repeats to count.
"""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import random_prompts
from tests.inference.engine.test_disaggregated import prefill, run_to_completion

PROMPT = random_prompts([15], seed=7)[0]
OTHERS = random_prompts([4, 30, 11], seed=8)
NUM_NEW_TOKENS = 32
GREEDY = dict(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20))


@pytest.fixture(scope="module")
def plain(engine):
    return engine.generate([PROMPT], SamplingParams(**GREEDY))[0]


@pytest.fixture(scope="module")
def penalized(plain) -> SamplingParams:
    """The first greedy token pushed up by 60 (it repeats), then held back by both penalties."""
    return SamplingParams(logit_bias={str(plain[0]): 60}, presence_penalty=2.0, frequency_penalty=2.0, **GREEDY)


def test_a_logit_bias_changes_the_greedy_output(engine, plain):
    banned = engine.generate([PROMPT], SamplingParams(logit_bias={str(plain[0]): -100}, **GREEDY))[0]
    assert banned != plain and banned[0] != plain[0]
    forced = engine.generate([PROMPT], SamplingParams(logit_bias={"77": 100}, **GREEDY))[0]
    assert forced[0] == 77 and forced != plain


def test_unbiased_requests_in_a_mixed_batch_are_token_identical_to_running_alone(engine, plain, penalized):
    alone = [engine.generate([prompt], SamplingParams(**GREEDY))[0] for prompt in OTHERS]
    biased_alone = engine.generate([PROMPT], penalized)[0]
    mixed = engine.generate([OTHERS[0], PROMPT, OTHERS[1], PROMPT, OTHERS[2]],
                            [SamplingParams(**GREEDY), penalized, SamplingParams(**GREEDY),
                             SamplingParams(logit_bias={"77": 100}, **GREEDY), SamplingParams(**GREEDY)])
    assert [mixed[0], mixed[2], mixed[4]] == alone
    assert mixed[1] == biased_alone and mixed[1] != plain


def test_penalties_pick_what_openai_definition_picks_from_the_models_logits(engine, plain, penalized, hf_model):
    tokens = engine.generate([PROMPT], penalized)[0]
    without = engine.generate([PROMPT], SamplingParams(logit_bias=penalized.logit_bias, **GREEDY))[0]
    assert tokens != without, "the penalties changed nothing: the test no longer exercises them"
    assert tokens.count(plain[0]) > 1, "the biased token never repeated: nothing for the penalties to count"
    with torch.inference_mode():
        logits = hf_model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1:-1].float()  # [n, V]
    counts = torch.zeros(logits.shape[1])
    for i, token_id in enumerate(tokens):
        adjusted = logits[i].clone()
        for biased, bias in penalized.logit_bias:
            adjusted[biased] += bias
        adjusted -= penalized.frequency_penalty * counts + penalized.presence_penalty * (counts > 0)
        # The engine's pick is the adjusted argmax (to float32 rounding between two implementations of the model).
        assert adjusted.max() - adjusted[token_id] < 1e-3, f"token {i}"
        counts[token_id] += 1


def test_prefill_then_decode_gives_the_colocated_tokens(engine, penalized, tiny_model_dir):
    colocated = engine.generate([PROMPT], penalized)[0]
    prefill_engine = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=1 << 20))
    decode_engine = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, kv_cache_bytes=1 << 20))
    out = prefill(prefill_engine, {"r": (PROMPT, penalized)})["r"]
    decode_engine.add_prefilled("r", PROMPT, out.new_token_ids[0], penalized, *out.kv)
    tokens, _ = run_to_completion(decode_engine)
    assert out.new_token_ids + tokens["r"] == colocated


@pytest.mark.parametrize("num_resumed", [1, 13, 20])
def test_a_resumed_request_counts_the_tokens_it_generated_before(engine, penalized, num_resumed):
    full = engine.generate([PROMPT], penalized)[0]
    rest = SamplingParams(logit_bias=penalized.logit_bias, presence_penalty=2.0, frequency_penalty=2.0,
                          max_tokens=NUM_NEW_TOKENS - num_resumed, ignore_eos=True)
    engine.add_request("resumed", PROMPT + full[:num_resumed], rest, num_resumed_tokens=num_resumed)
    tokens, _ = run_to_completion(engine)
    assert tokens["resumed"] == full[num_resumed:]


@pytest.mark.parametrize("speculative", [{"method": "ngram", "num_tokens": 4, "ngram_min": 1, "min_acceptance": 0},
                                         {"method": "layers", "num_tokens": 3, "layers": 3, "min_acceptance": 0}])
def test_speculation_leaves_adjusted_requests_to_the_sampler(engine, penalized, tiny_model_dir, speculative):
    # The biased output repeats itself: n-gram drafts would be accepted against the unadjusted logits.
    expected = engine.generate([PROMPT, OTHERS[1]], [penalized, SamplingParams(**GREEDY)])
    spec_engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=8 << 20, speculative=speculative))
    assert spec_engine.generate([PROMPT, OTHERS[1]], [penalized, SamplingParams(**GREEDY)]) == expected


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(ValueError, match="logit_bias must hold token ids in"):
        engine.add_request("far", PROMPT, SamplingParams(logit_bias={"4096": 5}))
    assert not engine.has_unfinished()
