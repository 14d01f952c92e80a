"""The replay simulation on small traces whose answers are known: exact step times for a lone request, the admission
queue's shedding and fairness, the prefix cache, more workers under overload, start-up and draining, the
autoscaler's rule, determinism, and the package's purity."""
from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.sizing.simulation import StageModel
from controlplane.replay.sim import Admission, Layout, Objectives, ReplayRequest, Scaling, replay
from controlplane.replay.sim.autoscaler import AutoscalerPolicy, default_pool_policy

MODEL = StageModel(prefill=PrefillCurve(0.01, 2e-4, 1e-8), decode=DecodeCurve(0.01, 5e-4, 1e-7), max_num_seqs=16,
                   max_batch_tokens=2048, kv_capacity_tokens=200_000, kv_transfer_s=0.002)
DISAGGREGATED = {"prefill": MODEL, "decode": MODEL}
COLOCATED = {"colocated": MODEL}
ANY = Objectives(ttft_s=None, itl_s=None)
ROOT = Path(__file__).resolve().parents[3]


def run(requests, *, models=DISAGGREGATED, layout=Layout("disaggregated", 1, 1), admission=Admission(),
        objectives=ANY, **kwargs):
    return replay(requests, models=models, layout=layout, admission=admission, objectives=objectives, **kwargs)


def test_a_lone_request_takes_exactly_the_curves_step_times():
    prompt, output = 300, 6
    result = run([ReplayRequest(0.0, prompt, output)])
    ttft = MODEL.prefill.step_seconds(prompt) + MODEL.kv_transfer_s
    gaps = [MODEL.decode.step_seconds(1, prompt + 1 + j) for j in range(output - 1)]
    assert result.ttft_s["p50"] == pytest.approx(ttft, rel=1e-12)
    assert result.itl_s["p50"] == pytest.approx(sorted(gaps)[2], rel=1e-12)
    assert result.e2e_s["p50"] == pytest.approx(ttft + sum(gaps), rel=1e-12)

    colocated = run([ReplayRequest(0.0, prompt, output)], models=COLOCATED, layout=Layout("colocated", 0, 1))
    assert colocated.ttft_s["p50"] == pytest.approx(MODEL.prefill.step_seconds(prompt), rel=1e-12)
    assert colocated.itl_s["p99"] == pytest.approx(max(gaps), rel=1e-12)


def test_a_prompt_longer_than_the_budget_prefills_in_chunks():
    result = run([ReplayRequest(0.0, 5000, 1)])
    chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    expected = sum(MODEL.prefill.step_seconds(c, c * (2 * before + c)) for c, before in chunks)
    assert result.ttft_s["p50"] == pytest.approx(expected + MODEL.kv_transfer_s, rel=1e-12)


def test_a_burst_beyond_running_and_queue_sheds_exactly_the_excess():
    burst = [ReplayRequest(0.0, 100, 20) for _ in range(30)]
    result = run(burst, admission=Admission(max_running=4, queue_size=6))
    assert result.shed == {"queue_full": 20}
    assert result.served == 10 and result.offered == 30
    assert result.slo_attainment == pytest.approx(10 / 30)


def test_without_a_bound_the_gateways_own_follows_the_serving_workers():
    model = StageModel(prefill=MODEL.prefill, decode=MODEL.decode, max_num_seqs=2, max_batch_tokens=2048)
    burst = [ReplayRequest(0.0, 100, 20) for _ in range(12)]
    one = run(burst, models={"colocated": model}, layout=Layout("colocated", 0, 1),
              admission=Admission(queue_size=3, headroom=1))
    two = run(burst, models={"colocated": model}, layout=Layout("colocated", 0, 2),
              admission=Admission(queue_size=3, headroom=1))
    assert one.shed == {"queue_full": 12 - 3 - 3} and two.shed == {"queue_full": 12 - 6 - 3}


def test_a_request_waiting_past_the_timeout_is_shed():
    burst = [ReplayRequest(0.0, 100, 200) for _ in range(6)]
    result = run(burst, admission=Admission(max_running=2, queue_timeout_s=1.0))
    assert result.shed == {"queue_timeout": 4}
    assert result.served == 2


def _flood_and_quiet():
    flood = [ReplayRequest(i * 0.01, 500, 100, tenant="flood") for i in range(300)]
    quiet = [ReplayRequest(1.0 + i * 0.5, 100, 10, tenant="quiet") for i in range(10)]
    return sorted(flood + quiet, key=lambda r: r.arrival_s)


def test_a_quiet_tenant_waits_far_less_behind_a_flood_with_fair_queuing():
    fair = run(_flood_and_quiet(), admission=Admission(max_running=8, fair=True))
    fifo = run(_flood_and_quiet(), admission=Admission(max_running=8, fair=False))
    assert fair.tenants["quiet"]["queue_wait_p99_s"] < 0.2 * fifo.tenants["quiet"]["queue_wait_p99_s"]
    assert fair.served == fifo.served == 310


def test_an_interactive_request_goes_before_a_batch_backlog():
    backlog = [ReplayRequest(0.0, 500, 100, tenant="batch", priority="batch") for _ in range(40)]
    urgent = [ReplayRequest(0.5, 100, 10, tenant="urgent", priority="interactive")]
    result = run(backlog + urgent, admission=Admission(max_running=4))
    assert result.tenants["urgent"]["queue_wait_p99_s"] < result.tenants["batch"]["queue_wait_p99_s"] / 5


def test_shared_prefixes_cut_prefill_time_and_show_a_hit_rate():
    shared = tuple(range(100))  # 1,600 tokens of a common system prompt
    requests = [ReplayRequest(i * 1.0, 1700, 2, block_hashes=shared + (1000 + i,), block_tokens=16)
                for i in range(20)]
    cold = run(requests, layout=Layout("disaggregated", 2, 1), routing="prefix")
    warm = run(requests, layout=Layout("disaggregated", 2, 1), routing="prefix", prefix_cache_blocks=1000)
    assert cold.prefix_hit_rate is None
    assert warm.prefix_hit_rate == pytest.approx(19 * 1600 / (20 * 1700))
    assert warm.ttft_s["p50"] < cold.ttft_s["p50"] / 3


def test_doubling_the_decode_pool_under_overload_raises_attainment():
    requests = [ReplayRequest(i * 0.1, 200, 200) for i in range(600)]
    objectives = Objectives(ttft_s=1.0, itl_s=0.02)
    one = run(requests, layout=Layout("disaggregated", 1, 2), objectives=objectives)
    two = run(requests, layout=Layout("disaggregated", 1, 4), objectives=objectives)
    assert two.slo_attainment > one.slo_attainment + 0.2


def test_a_scheduled_worker_serves_only_after_its_start_up():
    model = StageModel(prefill=MODEL.prefill, decode=MODEL.decode, max_num_seqs=1, max_batch_tokens=2048)
    pair = [ReplayRequest(t, 100, 50) for t in (20.0, 20.0, 45.0, 45.0)]
    result = run(pair, models={"colocated": model}, layout=Layout("colocated", 0, 1),
                 scaling=Scaling(schedule=((10.0, "colocated", 2),), startup_s=30.0))
    lone = MODEL.prefill.step_seconds(100)
    by_start = {row["start_s"]: row["ttft_p99_s"] for row in result.timeline if row["ttft_p99_s"] is not None}
    assert by_start[20.0] > 10 * lone  # one worker serving: the second request waited for the first to end
    assert by_start[40.0] == pytest.approx(lone)  # two serving: each its own
    horizon = result.duration_s
    assert result.worker_hours["colocated"] == pytest.approx((horizon + horizon - 10.0) / 3600)


def test_a_removed_worker_drains_what_it_holds():
    requests = [ReplayRequest(i * 0.1, 200, 300) for i in range(20)]
    result = run(requests, layout=Layout("disaggregated", 1, 2), scaling=Scaling(schedule=((1.0, "decode", 1),)))
    assert result.served == 20 and result.shed == {}
    assert result.timeline[-1]["replicas"] == {"prefill": 1, "decode": 1}


def test_the_autoscaler_scales_up_within_one_interval_of_a_load_step():
    light = [ReplayRequest(i * 2.0, 300, 20) for i in range(50)]
    step = [ReplayRequest(100.0 + i * 0.02, 2000, 50) for i in range(60)]
    # One worker more per evaluation, so that the second scale-up shows the hold.
    policy = AutoscalerPolicy({"colocated": default_pool_policy("colocated", min_replicas=1, max_replicas=4)},
                              max_step=1, step_period_s=0.0)
    result = run(light + step, models=COLOCATED, layout=Layout("colocated", 0, 1),
                 scaling=Scaling(policy=policy, interval_s=5.0, startup_s=20.0))
    scales = policy.scales["colocated"]
    assert [size for row in result.timeline[:10] for size in row["replicas"].values()] == [1] * 10
    assert 100.0 < scales[0][0] <= 105.0 and scales[0][1] == 1
    # It waits for the worker it asked for to be ready before it asks for more (autoscaler.py's hold).
    assert len(scales) >= 2 and scales[1] == (scales[0][0] + 20.0, 2)


def test_the_same_inputs_give_the_same_result():
    requests = [ReplayRequest(i * 0.03, 100 + (i * 37) % 900, 1 + (i * 11) % 120, tenant=f"t{i % 3}",
                              block_hashes=tuple(range(i % 5)), block_tokens=16) for i in range(400)]
    kwargs = dict(layout=Layout("disaggregated", 2, 2), admission=Admission(max_running=12, queue_size=50,
                                                                              queue_timeout_s=2.0),
                  prefix_cache_blocks=64, routing="prefix", objectives=Objectives(0.5, 0.05))
    assert run(requests, **kwargs).as_dict() == run(requests, **kwargs).as_dict()


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="models"):
        run([ReplayRequest(0.0, 10, 1)], models=COLOCATED)
    with pytest.raises(ValueError, match="priority"):
        run([ReplayRequest(0.0, 10, 1, priority="urgent")])
    with pytest.raises(ValueError, match="routing"):
        run([ReplayRequest(0.0, 10, 1)], routing="random")


def test_the_simulation_imports_neither_django_nor_the_control_planes_state():
    from tests.test_import_graph import _imported_names

    allowed = ("controlplane.replay.sim", "controlplane.capacity.sizing", "controlplane.autoscaling.hpa",
               "inference.gateway.fair_queue", "inference.gateway.prefix_affinity")
    found = []
    for path in sorted((ROOT / "controlplane/replay/sim").rglob("*.py")):
        for name in _imported_names(path):
            if name.startswith(("django", "rest_framework", "celery", "controlplane", "dashboards", "inference")) \
                    and not name.startswith(allowed):
                found.append(f"{path.name} imports {name}")
    assert found == []
