"""The `speculative` setting is checked where it enters (Config: a ConfigError naming it and the key inside it), the
n-gram proposer finds the latest earlier occurrence of the longest suffix, a sequence drafts only inside its
request's end and its blocks, and one whose drafts keep failing pauses (the off rule in speculation_policy.py)."""
from __future__ import annotations

import pytest

from inference.engine import Config, SamplingParams, Sequence
from inference.engine.block_manager import BlockManager
from inference.engine.config import ConfigError
from inference.engine.speculation_policy import PAUSE_GROWTH, PAUSE_MAX, PAUSE_MIN, WINDOW, Speculator, parse_speculative, propose_ngram
from inference.roles import Role


@pytest.mark.parametrize("value, fragment", [
    ({"method": "ngram"}, "num_tokens must be an integer in 1..16, got None"),
    ({"method": "ngram", "num_tokens": 17}, "num_tokens must be an integer in 1..16, got 17"),
    ({"method": "layers", "num_tokens": 2, "layers": 0}, "layers must be an integer"),
    ({"method": "ngram", "num_tokens": 2, "min_acceptance": 1.5}, "min_acceptance must be a number in 0..1"),
    ({"method": "ngram", "num_tokens": 2, "typo": 1}, "typo is not a key of method ngram"),
    ([1, 2], "must be null or an object"),
])
def test_a_bad_setting_is_a_config_error_naming_the_key(tiny_model_dir, value, fragment):
    with pytest.raises(ConfigError) as info:
        Config(model=tiny_model_dir, speculative=value)
    assert info.value.field == "speculative" and fragment in str(info.value)


def test_the_prefill_role_refuses_it(tiny_model_dir):
    with pytest.raises(ConfigError, match="decode and colocated roles"):
        Config(model=tiny_model_dir, role="prefill", speculative={"method": "ngram", "num_tokens": 2})


def test_defaults_are_filled_in(tiny_model_dir):
    config = Config(model=tiny_model_dir, speculative={"method": "ngram", "num_tokens": 3})
    assert config.speculative == {"method": "ngram", "num_tokens": 3, "ngram_max": 4, "ngram_min": 2,
                                  "min_acceptance": 0.2}
    assert Config(model=tiny_model_dir).speculative is None


def test_layers_deeper_than_the_model_are_refused_at_load(tiny_model_dir):
    from inference.engine import LLMEngine

    with pytest.raises(ValueError, match=r"layers must be in 1..3 for this model \(4 layers\), got 4"):
        LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20,
                         speculative={"method": "layers", "num_tokens": 2, "layers": 4}))


def test_ngram_proposes_what_followed_the_latest_occurrence_of_the_longest_suffix():
    tokens = [5, 1, 2, 3, 9, 9, 1, 2, 4, 8, 7, 1, 2]
    # [1, 2] occurs at 1 and 6; the latest (6) wins: 4, 8, 7 followed it.
    assert propose_ngram(tokens, ngram_max=3, ngram_min=2, num_tokens=3) == [4, 8, 7]
    # [7, 1, 2] never occurred before; [1, 2] did.
    assert propose_ngram(tokens, ngram_max=3, ngram_min=3, num_tokens=3) == []
    assert propose_ngram(tokens, ngram_max=2, ngram_min=1, num_tokens=10) == [4, 8, 7, 1, 2]
    assert propose_ngram([1, 2, 3], ngram_max=4, ngram_min=1, num_tokens=2) == []
    assert propose_ngram([4, 4], ngram_max=4, ngram_min=1, num_tokens=2) == [4]


def _speculator(num_blocks=8, role=Role.COLOCATED, **spec):
    config = parse_speculative({"method": "ngram", "num_tokens": 4, **spec})
    bm = BlockManager(num_blocks, 4)
    return Speculator(config, decoder=None, block_manager=bm, max_model_len=64, role=role), bm


def _running(bm, prompt_len=5, max_tokens=10, reserve=None):
    seq = Sequence("s", list(range(prompt_len)), SamplingParams(max_tokens=max_tokens))
    bm.allocate(seq, reserve or prompt_len)
    seq.append_token(1)  # the first token; the next decode feeds it
    return seq


def test_drafts_stop_short_of_max_tokens_and_take_free_blocks_only():
    spec, bm = _speculator(num_blocks=3, min_acceptance=0)  # no probing: num_tokens from the first step
    seq = _running(bm, max_tokens=10)  # 6 tokens in 2 blocks
    assert spec.plan(seq) == 4 and len(seq.block_table) == 3  # positions 5..9 need a third block
    seq.token_ids += [1] * 6  # 12 tokens, 7 of 10 completion tokens
    assert spec.plan(seq) == 0  # 12 slots held, no block free: no room past the last token's slot
    spec2, bm2 = _speculator(num_blocks=8, min_acceptance=0)
    seq2 = _running(bm2, max_tokens=3)
    assert spec2.plan(seq2) == 1  # 1 of 3 tokens made: this step may yield 2 more, so 1 draft


def test_a_decode_sequence_drafts_inside_its_reservation_only():
    spec, bm = _speculator(num_blocks=8, role=Role.DECODE, min_acceptance=0)
    seq = _running(bm, prompt_len=5, max_tokens=6, reserve=5 + 6 - 1)  # 10 slots: 3 blocks = 12
    assert spec.plan(seq) == 4 and bm.num_free_blocks == 5
    seq.token_ids += [1, 1, 1]  # 9 tokens, 4 of 6 made
    assert spec.plan(seq) == 1 and bm.num_free_blocks == 5


def test_a_sequence_probes_with_one_draft_pauses_when_drafts_fail_and_the_pause_grows():
    spec, bm = _speculator(min_acceptance=0.5)
    seq = _running(bm, max_tokens=400)
    for _ in range(WINDOW):
        assert spec.plan(seq) == 1  # probing
        spec._record(seq, 1, 1)
    assert spec.plan(seq) == 4  # a window passed: full drafts
    for _ in range(WINDOW):
        spec._record(seq, 4, 1)  # 25% kept
    for _ in range(PAUSE_MIN):
        assert spec.plan(seq) == 0
    assert spec.plan(seq) == 1  # the probe after the pause
    for _ in range(WINDOW - 1):
        spec._record(seq, 1, 0)
        assert spec.plan(seq) == 1
    spec._record(seq, 1, 0)
    paused = 0
    while spec.plan(seq) == 0:
        paused += 1
    assert paused == PAUSE_GROWTH * PAUSE_MIN <= PAUSE_MAX
    for _ in range(WINDOW):
        spec._record(seq, 1, 1)  # a good window resets the pause and ends the probing
    assert spec._states[seq].pause == PAUSE_MIN and spec.plan(seq) == 4
    assert spec.num_accepted_tokens == WINDOW * 1 + WINDOW * 1 + WINDOW * 1
