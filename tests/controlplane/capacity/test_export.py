"""Stored profiles as a simulated-worker profile: the fitted stages copied as stored (one stage-cost format, no
conversion), real KV bytes per token, and the file loads in a simulated worker with the fits' own latencies."""
import pytest

from controlplane.capacity.export import profiles_export
from controlplane.capacity.models import Profile
from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve
from inference.worker.sim_profile import parse_profile


def test_a_disaggregated_profile_exports_both_roles(deployment):
    revision = deployment.current_revision
    prefill = Profile.objects.create(
        revision=revision, role="prefill", kv_bytes_per_token=4096, kv_capacity_tokens=1000,
        info={"max_model_len": 2048}, fits={"prefill": {"a": 0.01, "b": 1e-4, "c": 1e-7}},
        points={"prefill": [{"prompt_tokens": n, "batch": 1, "batch_tokens": n, "latency_s": 0.1,
                             "source": "synthetic"} for n in (16, 256, 1024)]})
    decode = Profile.objects.create(
        revision=revision, role="decode", kv_bytes_per_token=4096, kv_capacity_tokens=1000,
        info={"max_model_len": 1024}, fits={"decode": {"a": 0.02, "b": 0.001, "c": 2e-7}}, points={"decode": []})
    data = profiles_export([prefill, decode])
    assert data["format"] == 1 and data["name"] == "demo-r1-default" and data["max_model_len"] == 1024
    assert data["roles"]["prefill"]["prefill"] == prefill.fits["prefill"]
    assert data["roles"]["decode"]["decode"] == decode.fits["decode"]
    assert data["roles"]["decode"]["kv_cache_bytes"] == 4096 * 1000
    assert set(data["kv_layout"]) == {"num_layers", "num_kv_heads", "head_dim", "dtype"}
    simulated = parse_profile(data)
    curve = PrefillCurve(**prefill.fits["prefill"])
    assert simulated.role("prefill").prefill_seconds(512) == pytest.approx(curve.step_seconds(512))
    step = DecodeCurve(**decode.fits["decode"])
    assert simulated.role("decode").decode_step_seconds(8, 8 * 300) == pytest.approx(step.step_seconds(8, 300))
