"""Sequence bookkeeping and SamplingParams validation (no torch)."""
import pytest

from inference.engine.sequence import SamplingParams, Sequence, SequenceStatus


def test_a_new_sequence_waits_and_counts_its_prompt():
    seq = Sequence("r1", [5, 6, 7], SamplingParams(max_tokens=4))
    assert seq.status is SequenceStatus.WAITING
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_completion_tokens) == (3, 3, 0)
    assert seq.block_table == [] and seq.num_cached_tokens == 0


def test_appended_tokens_count_as_completion():
    seq = Sequence("r1", [5, 6, 7], SamplingParams())
    seq.append_token(9)
    seq.append_token(11)
    assert seq.completion_token_ids == [9, 11]
    assert seq.last_token_id == 11
    assert (seq.num_tokens, seq.num_completion_tokens) == (5, 2)


def test_the_prompt_is_copied_not_aliased():
    prompt = [1, 2]
    seq = Sequence("r1", prompt, SamplingParams())
    seq.append_token(3)
    assert prompt == [1, 2]


def test_default_sampling_is_greedy():
    assert SamplingParams().is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": -3}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
])
def test_sampling_params_reject_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_accept_the_full_valid_range():
    params = SamplingParams(max_tokens=1, temperature=2.0, top_p=0.01, top_k=50, seed=0, ignore_eos=True)
    assert params.top_k == 50 and params.seed == 0
