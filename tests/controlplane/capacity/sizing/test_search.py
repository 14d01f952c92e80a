"""The replica search on known stage models: both layouts sized within the objectives and the cheaper
recommended, costs that add up, more traffic needing more replicas, and an impossible objective said to be
impossible."""
import pytest

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.sizing.search import Objectives, Prices, colocated_model, plan
from controlplane.capacity.sizing.simulation import StageModel, Traffic

MODEL = StageModel(prefill=PrefillCurve(0.01, 2e-4), decode=DecodeCurve(0.01, 5e-4, 1e-7), max_num_seqs=32,
                   max_batch_tokens=2048, kv_capacity_tokens=50_000, kv_transfer_s=0.002)
TRAFFIC = Traffic(requests_per_s=5, prompt_tokens_mean=200, output_tokens_mean=50)
MODELS = {"prefill": MODEL, "decode": MODEL, "colocated": colocated_model(MODEL, MODEL)}


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
