"""The stage-cost format: three terms per stage, each a number >= 0 (c optional), a bad one named; the simulated
worker's first spelling is renamed term by term."""
import pytest

from inference.stage_costs import StageCostError, decode_cost, legacy_costs, prefill_cost


def test_prefill_is_quadratic_in_each_prompt_and_decode_linear_in_tokens_held():
    prefill = prefill_cost({"a": 0.01, "b": 1e-4, "c": 1e-7})
    assert prefill.step_seconds(100) == pytest.approx(0.01 + 0.01 + 0.001)
    assert prefill.step_seconds(200, 2 * 100 ** 2) == pytest.approx(0.01 + 0.02 + 0.002)  # two prompts of 100
    decode = decode_cost({"a": 0.02, "b": 1e-3})
    assert decode.c == 0.0 and decode.step_seconds(4, 1000) == pytest.approx(0.024)


@pytest.mark.parametrize("value, message", [
    ({"a": -1, "b": 0}, r"roles\.x\.prefill\.a must be a number >= 0"),
    ({"a": True, "b": 0}, r"\.a must be a number"),
    ({"a": 0.1, "per_token": 1}, r"unknown keys \['per_token'\]"),
    ([0.1, 0.2], "must be an object"),
])
def test_a_bad_cost_names_what_is_wrong(value, message):
    with pytest.raises(StageCostError, match=message):
        prefill_cost(value, "roles.x.prefill")


def test_the_first_spelling_is_renamed_and_never_mixed_with_the_new():
    entry = legacy_costs({"prefill_s": {"base": 0.004, "per_token": 2e-5},
                          "decode_step_s": {"base": 0.003, "per_seq": 2e-4, "per_context_token": 1e-7},
                          "kv_bytes_per_token": 8}, "roles.colocated")
    assert entry == {"prefill": {"a": 0.004, "b": 2e-5}, "decode": {"a": 0.003, "b": 2e-4, "c": 1e-7},
                     "kv_bytes_per_token": 8}
    with pytest.raises(StageCostError, match="both decode and decode_step_s"):
        legacy_costs({"decode": {"a": 1}, "decode_step_s": {"base": 1}}, "roles.decode")
