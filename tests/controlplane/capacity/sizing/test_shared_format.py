"""The capacity model's curves and the simulated worker's stage costs are one format: the same terms, the same
step times, and a stored fit reads on either side as it is."""
import random

import pytest

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve, fit_decode, fit_prefill
from inference.stage_costs import DecodeCost, PrefillCost, decode_cost, prefill_cost


def test_the_capacity_model_fits_the_stage_cost_classes_themselves():
    assert PrefillCurve is PrefillCost and DecodeCurve is DecodeCost


def test_a_fitted_curve_read_as_a_stage_cost_gives_the_same_step_times():
    rng = random.Random(7)
    prefill = fit_prefill([{"prompt_tokens": n, "batch": k, "batch_tokens": n * k,
                            "latency_s": 0.01 + 2e-4 * n * k + 3e-8 * k * n * n} for n in (16, 128, 512)
                           for k in (1, 4)])
    decode = fit_decode([{"batch": b, "context": L, "step_s": 0.02 + 1e-3 * b + 2e-7 * b * L}
                         for b in (1, 4, 16) for L in (64, 512)])
    read_prefill, read_decode = prefill_cost(prefill.as_dict()), decode_cost(decode.as_dict())
    for _ in range(20):
        tokens, batch, context = rng.randint(1, 4096), rng.randint(1, 64), rng.randint(1, 4096)
        assert read_prefill.step_seconds(tokens) == pytest.approx(prefill.step_seconds(tokens))
        assert read_prefill.step_seconds(tokens, tokens * 7) == pytest.approx(prefill.step_seconds(tokens, tokens * 7))
        assert read_decode.step_seconds(batch, context) == pytest.approx(decode.step_seconds(batch, context))
