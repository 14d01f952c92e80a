"""Curve fitting: exact on points that follow the model, never a negative coefficient, and the KV size of a layout."""
import pytest

from controlplane.capacity.sizing.curves import fit_decode, fit_prefill, kv_bytes_per_token


def test_a_prefill_fit_recovers_linear_and_per_prompt_quadratic_terms():
    points = [{"prompt_tokens": n, "batch": k, "batch_tokens": k * n, "latency_s": 0.01 + 2e-4 * k * n + 1e-7 * k * n * n}
              for n in (16, 256, 1024) for k in (1, 4)]
    fit = fit_prefill(points)
    assert fit.a == pytest.approx(0.01, rel=1e-6) and fit.b == pytest.approx(2e-4, rel=1e-6)
    assert fit.c == pytest.approx(1e-7, rel=1e-6)
    assert fit.step_seconds(512) == pytest.approx(0.01 + 2e-4 * 512 + 1e-7 * 512 * 512)
    # Eight prompts of 64 cost far less attention than one of 512.
    assert fit.step_seconds(512, 8 * 64 * 64) == pytest.approx(0.01 + 2e-4 * 512 + 1e-7 * 8 * 64 * 64)


def test_a_term_that_fits_negative_is_dropped_not_kept():
    # Latency flat then falling slightly: an unconstrained fit would give a negative slope.
    points = [{"prompt_tokens": t, "batch": 1, "batch_tokens": t, "latency_s": v}
              for t, v in ((10, 0.05), (100, 0.049), (1000, 0.048))]
    fit = fit_prefill(points)
    assert fit.a > 0 and fit.b >= 0 and fit.c >= 0


def test_a_decode_fit_separates_batch_from_context():
    points = [{"batch": b, "context": ctx, "step_s": 0.005 + 0.001 * b + 1e-6 * b * ctx}
              for b in (1, 2, 4, 8) for ctx in (32, 512)]
    fit = fit_decode(points)
    assert (fit.a, fit.b) == (pytest.approx(0.005, rel=1e-6), pytest.approx(0.001, rel=1e-6))
    assert fit.c == pytest.approx(1e-6, rel=1e-6)


def test_a_fit_needs_two_load_levels():
    with pytest.raises(ValueError, match="2 or more batch sizes"):
        fit_prefill([{"batch_tokens": 8, "latency_s": 0.1}, {"batch_tokens": 8, "latency_s": 0.2}])


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer():
    assert kv_bytes_per_token({"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "dtype": "bfloat16"}) == 23040
