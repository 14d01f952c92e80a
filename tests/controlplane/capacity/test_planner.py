"""The simulation and the planner on known stage models: queueing grows with load, more replicas help, a
prefill stall shows in colocated ITL, an impossible objective is said to be impossible, and costs add up."""
import pytest

from controlplane.capacity.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.planner import Objectives, Prices, colocated_model, plan
from controlplane.capacity.simulate import StageModel, Traffic, simulate

MODEL = StageModel(prefill=PrefillCurve(0.01, 2e-4), decode=DecodeCurve(0.01, 5e-4, 1e-7), max_num_seqs=32,
                   max_batch_tokens=2048, kv_capacity_tokens=50_000, kv_transfer_s=0.002)
TRAFFIC = Traffic(requests_per_s=5, prompt_tokens_mean=200, output_tokens_mean=50)
MODELS = {"prefill": MODEL, "decode": MODEL, "colocated": colocated_model(MODEL, MODEL)}


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


def test_the_plan_sizes_both_layouts_meets_the_objectives_and_recommends_the_cheaper():
    objectives = Objectives(ttft_p99_s=0.2, itl_p99_s=0.05)
    result = plan(models=MODELS, traffic=TRAFFIC, objectives=objectives, prices=Prices(2.0, 1.0, 1.5))
    for layout in ("disaggregated", "colocated"):
        planned = result["layouts"][layout]
        assert planned["feasible"], planned["reason"]
        assert planned["predicted"]["ttft_p99_s"] <= 0.2 and planned["predicted"]["itl_p99_s"] <= 0.05
        assert planned["headroom"] >= 0
    disaggregated = result["layouts"]["disaggregated"]
    assert disaggregated["cost_per_hour"] == 2.0 * disaggregated["replicas"]["prefill"] + \
        disaggregated["replicas"]["decode"]
    tokens_per_hour = 5 * (200 + 50) * 3600
    assert disaggregated["cost_per_million_tokens"] == pytest.approx(disaggregated["cost_per_hour"] /
                                                                     tokens_per_hour * 1e6)
    cheaper = min(("disaggregated", "colocated"), key=lambda name: result["layouts"][name]["cost_per_hour"])
    assert result["recommended"] == cheaper


def test_twice_the_traffic_needs_more_replicas():
    objectives = Objectives(ttft_p99_s=0.2, itl_p99_s=0.05)
    base = plan(models=MODELS, traffic=TRAFFIC, objectives=objectives, prices=Prices(), headroom=False)
    double = plan(models=MODELS, traffic=TRAFFIC.scaled(rate=2), objectives=objectives, prices=Prices(),
                  headroom=False)
    assert sum(double["layouts"]["colocated"]["replicas"].values()) > \
        sum(base["layouts"]["colocated"]["replicas"].values())


def test_an_itl_objective_below_one_idle_step_is_infeasible_with_the_reason():
    result = plan(models=MODELS, traffic=TRAFFIC, objectives=Objectives(ttft_p99_s=1.0, itl_p99_s=0.005),
                  prices=Prices(), headroom=False)
    assert result["recommended"] is None
    assert "above the ITL objective" in result["layouts"]["colocated"]["reason"]
    assert "no layout meets the objectives" in result["why"]
