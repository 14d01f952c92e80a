"""The simulation on a known stage model: idle it answers at the fitted step times, queueing grows with load, more
replicas help, a stable run serves what is offered, and a prefill stall shows in colocated ITL."""
import pytest

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.sizing.simulation import StageModel, Traffic, simulate

MODEL = StageModel(prefill=PrefillCurve(0.01, 2e-4), decode=DecodeCurve(0.01, 5e-4, 1e-7), max_num_seqs=32,
                   max_batch_tokens=2048, kv_capacity_tokens=50_000, kv_transfer_s=0.002)
TRAFFIC = Traffic(requests_per_s=5, prompt_tokens_mean=200, output_tokens_mean=50)


def test_an_idle_pool_answers_at_the_fitted_step_times():
    light = simulate(MODEL, Traffic(0.05, 200, 20, 0, 0), layout="disaggregated", prefill_replicas=1,
                     decode_replicas=1, num_requests=100)
    assert light.ttft_p50_s == pytest.approx(MODEL.prefill.step_seconds(200) + 0.002, rel=1e-6)
    assert light.itl_p50_s == pytest.approx(MODEL.decode.step_seconds(1, 201 + 10), rel=0.05)
    assert light.stable


def test_more_load_means_longer_queues_and_more_replicas_shorten_them():
    one = simulate(MODEL, TRAFFIC.scaled(rate=8), layout="disaggregated", prefill_replicas=1, decode_replicas=1)
    two = simulate(MODEL, TRAFFIC.scaled(rate=8), layout="disaggregated", prefill_replicas=3, decode_replicas=4)
    assert not one.stable and two.stable
    assert two.ttft_p99_s < one.ttft_p99_s and two.itl_p99_s < one.itl_p99_s


def test_a_stable_run_serves_what_is_offered():
    result = simulate(MODEL, TRAFFIC, layout="colocated", decode_replicas=3)
    assert result.throughput_rps == pytest.approx(TRAFFIC.requests_per_s, rel=0.15)
    assert 0 < result.utilisation["colocated"] < 1


def test_colocated_prefill_steps_stall_decoding_sequences():
    disaggregated = simulate(MODEL, TRAFFIC, layout="disaggregated", prefill_replicas=1, decode_replicas=2)
    colocated = simulate(MODEL, TRAFFIC, layout="colocated", decode_replicas=2)
    assert colocated.itl_p99_s > disaggregated.itl_p99_s
