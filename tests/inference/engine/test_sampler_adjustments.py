"""The sampler's OpenAI logit adjustments, one step on made-up logits: logit_bias, then presence and frequency
penalties over the tokens a request generated (never its prompt), each on its own row of the batch."""
from __future__ import annotations

import pytest
import torch

from inference.engine.sampler import Sampler, adjust_logits
from inference.engine.sequence import Sequence
from inference.sampling_params import SamplingParams

VOCAB_SIZE = 64
PROMPT = [3, 9, 40]


def _logits(num_rows: int = 1, seed: int = 0) -> torch.Tensor:
    # logits: [B, V], spread like a model's
    return torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(seed)) * 8


def _seq(generated: list[int] = (), prompt: list[int] = PROMPT, num_resumed_tokens: int = 0, **params) -> Sequence:
    seq = Sequence("r", prompt, SamplingParams(**params), num_resumed_tokens)
    for token_id in generated:
        seq.append_token(token_id)
    return seq


@pytest.fixture
def sampler() -> Sampler:
    return Sampler(torch.device("cpu"))


def test_a_bias_of_plus_100_makes_greedy_pick_the_token(sampler):
    logits = _logits()
    least_likely = int(logits[0].argmin())
    assert sampler(logits, [_seq(logit_bias={str(least_likely): 100})]) == [least_likely]


def test_a_bias_of_minus_100_bans_the_greedy_token(sampler):
    logits = _logits()
    greedy, runner_up = logits[0].topk(2).indices.tolist()
    assert sampler(logits, [_seq(logit_bias={str(greedy): -100})]) == [runner_up]


def test_a_bias_applies_to_sampled_requests_too(sampler):
    logits = _logits()
    least_likely = int(logits[0].argmin())
    seqs = [_seq(temperature=1.0, seed=seed, logit_bias={least_likely: 100}) for seed in range(8)]
    assert sampler(logits.repeat(8, 1), seqs) == [least_likely] * 8


def test_frequency_penalty_lowers_a_token_by_exactly_penalty_times_count(sampler):
    logits = _logits()
    adjusted = adjust_logits(logits, [_seq([5, 7, 5, 5], frequency_penalty=0.5)])
    assert adjusted[0, 5] == logits[0, 5] - 1.5  # 3 times
    assert adjusted[0, 7] == logits[0, 7] - 0.5  # once
    untouched = [j for j in range(VOCAB_SIZE) if j not in (5, 7)]
    assert torch.equal(adjusted[0, untouched], logits[0, untouched])


def test_presence_penalty_lowers_a_generated_token_once_whatever_its_count(sampler):
    logits = _logits()
    adjusted = adjust_logits(logits, [_seq([5, 7, 5, 5], presence_penalty=1.25)])
    assert adjusted[0, 5] == logits[0, 5] - 1.25
    assert adjusted[0, 7] == logits[0, 7] - 1.25


def test_both_penalties_add_up_as_openai_defines_them(sampler):
    logits = _logits()
    adjusted = adjust_logits(logits, [_seq([5, 5], presence_penalty=-0.75, frequency_penalty=1.5)])
    assert adjusted[0, 5] == logits[0, 5] - (1.5 * 2 - 0.75)


def test_the_prompt_is_not_penalized(sampler):
    logits = _logits()
    adjusted = adjust_logits(logits, [_seq([5], presence_penalty=2.0, frequency_penalty=2.0)])
    assert torch.equal(adjusted[0, PROMPT], logits[0, PROMPT])


def test_a_penalty_counts_the_tokens_a_resumed_request_generated_before(sampler):
    # The prompt ends with 2 tokens the request generated on a worker that died: they count as generated.
    logits = _logits()
    seq = _seq([5], prompt=PROMPT + [9, 9], num_resumed_tokens=2, frequency_penalty=1.0)
    adjusted = adjust_logits(logits, [seq])
    assert adjusted[0, 9] == logits[0, 9] - 2.0 and adjusted[0, 5] == logits[0, 5] - 1.0
    assert adjusted[0, 3] == logits[0, 3]


def test_a_penalty_turns_greedy_away_from_a_repeated_token(sampler):
    logits = _logits()
    greedy, runner_up = logits[0].topk(2).indices.tolist()
    margin = float(logits[0, greedy] - logits[0, runner_up])
    num_repeats = int(margin // 2) + 1  # frequency_penalty 2 x this many repeats outweighs the margin
    assert sampler(logits, [_seq([greedy] * num_repeats)]) == [greedy]
    assert sampler(logits, [_seq([greedy] * num_repeats, frequency_penalty=2.0)]) == [runner_up]


def test_only_the_rows_that_ask_are_adjusted(sampler):
    logits = _logits(3)
    seqs = [_seq([1, 2]), _seq([1, 2], logit_bias={"4": 50}, frequency_penalty=2.0), _seq([1, 2], top_k=3)]
    adjusted = adjust_logits(logits, seqs)
    assert torch.equal(adjusted[[0, 2]], logits[[0, 2]])
    assert adjusted[1, 4] == logits[1, 4] + 50 and adjusted[1, 1] == logits[1, 1] - 2
    assert not torch.equal(adjusted[1], logits[1])


def test_the_callers_logits_are_never_written(sampler):
    logits = _logits()
    before = logits.clone()
    sampler(logits, [_seq([5], logit_bias={"5": -100}, presence_penalty=1.0)])
    assert torch.equal(logits, before)


@pytest.mark.parametrize("params", [{}, {"logit_bias": {"5": 0}}, {"logit_bias": {}}, {"presence_penalty": 0},
                                    {"frequency_penalty": 0.0, "logit_bias": None}])
def test_zero_and_absent_values_ask_for_nothing(params):
    # A batch whose requests all answer False skips adjust_logits whole.
    assert SamplingParams(**params).adjusts_logits is False
