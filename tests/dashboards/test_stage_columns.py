"""The deployment page's stage columns: prefill | decode side by side (one column for a colocated deployment), each
with its indicators as charts and current values; objectives shown and drawn; CPU figures said to be CPU figures;
batch tokens per step and the GPU health charts say why they are empty."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _page(client, name="demo") -> str:
    response = client.get(f"/deployments/{name}/")
    assert response.status_code == 200
    return response.content.decode()


def _stages(client, name="demo") -> dict:
    response = client.get(f"/deployments/{name}/stages.json?range=15m")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    return response.json()


def _value(html: str, cell: str) -> str:
    match = re.search(rf'data-stage-value="{re.escape(cell)}">([^<]*)<', html)
    assert match, cell
    return match.group(1)


def test_a_disaggregated_deployment_shows_prefill_and_decode_columns_with_their_indicators(
        client_for, viewer, deployment):
    stages = _stages(client_for(viewer))
    assert [c["role"] for c in stages["columns"]] == ["prefill", "decode"]
    prefill, decode = stages["columns"]
    assert [v["key"] for v in prefill["values"]] == ["ttft", "prompt_tokens", "queue", "batch", "prefix_cache",
                                                      "compute", "prefill_roofline"]
    assert [v["key"] for v in decode["values"]] == ["itl", "gen_tokens", "running", "kv", "spec", "memory",
                                                     "decode_roofline"]
    assert prefill["order"] == [f"stage-prefill-{k}" for k in ("ttft", "prompt_tokens", "queue", "batch",
                                                                       "prefix_cache", "compute", "prefill_roofline")]
    assert set(prefill["order"] + decode["order"]) <= set(stages["figures"])
    html = _page(client_for(viewer))
    assert 'id="stage-prefill"' in html and 'id="stage-decode"' in html
    assert html.index('id="stage-prefill"') < html.index('id="stage-decode"')


def test_a_colocated_deployment_has_one_column_with_both_sets(client_for, viewer, make_deployment):
    make_deployment("solo", mode="colocated")
    stages = _stages(client_for(viewer), "solo")
    assert [c["role"] for c in stages["columns"]] == ["colocated"]
    keys = [v["key"] for v in stages["columns"][0]["values"]]
    assert keys == ["ttft", "prompt_tokens", "queue", "batch", "prefix_cache", "compute", "prefill_roofline",
                    "itl", "gen_tokens", "running", "kv", "spec", "memory", "decode_roofline"]
    assert "Prefill and decode" in _page(client_for(viewer), "solo")


def test_current_values_are_each_pools_own(client_for, viewer, deployment, seed_samples):
    seed_samples(deployment, "ttft_p99_seconds", [0.4, 0.6], role="prefill")
    seed_samples(deployment, "ttft_p99_seconds", [9.0], role="gateway")  # the client's view: not the stage's
    seed_samples(deployment, "requests_waiting", [3], role="prefill")
    seed_samples(deployment, "generation_tokens_per_second", [42.0], role="decode")
    seed_samples(deployment, "kv_cache_usage_ratio", [0.25], role="decode")
    html = _page(client_for(viewer))
    assert _value(html, "prefill:ttft") == "600 ms (objective 10.00 s)"
    assert _value(html, "prefill:queue") == "3.0 requests"
    assert _value(html, "decode:gen_tokens") == "42.0 tokens/s"
    assert _value(html, "decode:kv") == "25.0%"
    assert _value(html, "decode:itl").startswith("–")  # no data is a dash, never 0


def test_latency_charts_draw_the_objective_as_a_dashed_line(client_for, viewer, operator, deployment, seed_samples):
    from controlplane.services import deployment_objectives_set

    deployment_objectives_set(deployment=deployment, objectives={"itl_p99_seconds": 0.25}, actor=operator)
    seed_samples(deployment, "itl_p99_seconds", [0.1, 0.3, 0.2], role="decode")
    figure = _stages(client_for(viewer))["figures"]["stage-decode-itl"]
    objective = next(t for t in figure["data"] if t["name"] == "objective P99")
    assert objective["line"]["dash"] == "dash" and set(objective["y"]) == {250.0}  # drawn in ms
    assert "P99 decode" in {t["name"] for t in figure["data"]}
    assert "ITL ≤ 250 ms" in _page(client_for(viewer)).replace("\n", " ").replace("  ", "")


def test_on_a_cpu_host_compute_is_cpu_per_thread_and_memory_is_resident_and_the_page_says_so(
        client_for, viewer, deployment, make_worker, seed_samples):
    from controlplane.models import Revision

    Revision.objects.filter(pk=deployment.current_revision_id).update(engine_settings={"threads": 2})
    worker = make_worker(deployment, "prefill")
    seed_samples(deployment, "cpu_usage_ratio", [1.5], role="prefill", worker=worker)
    seed_samples(deployment, "cpu_usage_ratio", [1.5], role="prefill")
    stages = _stages(client_for(viewer))
    compute = stages["figures"]["stage-prefill-compute"]
    assert "CPU" in compute["layout"]["title"]["text"]
    assert compute["data"][0]["y"] == [75.0]  # 1.5 cores of 2 threads, in %
    assert "Resident memory" in stages["figures"]["stage-decode-memory"]["layout"]["title"]["text"]
    html = _page(client_for(viewer))
    assert 'id="stages-cpu"' in html and "this host has no GPU" in html
    assert _value(html, "prefill:compute") == "75.0%"


def test_on_a_gpu_host_compute_and_memory_are_nvml_series(client_for, viewer, deployment, node, make_worker,
                                                          seed_samples):
    node.gpus = [{"index": 0, "name": "H100", "memory_total_bytes": 80 << 30}]
    node.save(update_fields=["gpus"])
    worker = make_worker(deployment, "decode")
    seed_samples(deployment, "gpu_memory_used_bytes", [3 << 30], role="decode", worker=worker)
    seed_samples(deployment, "gpu_temperature_celsius", [61.0], role="decode", worker=worker)
    seed_samples(deployment, "gpu_memory_fragmentation_bytes", [512 << 20], role="decode", worker=worker)
    stages = _stages(client_for(viewer))
    assert stages["has_gpu"] is True
    assert stages["figures"]["stage-decode-memory"]["layout"]["title"]["text"] == "GPU memory per worker"
    assert stages["figures"]["stage-prefill-compute"]["layout"]["title"]["text"] == "GPU utilisation per worker"
    assert stages["figures"]["health-gpu_temp"]["data"][0]["y"] == [61.0]
    assert stages["figures"]["health-gpu_frag"]["data"][0]["y"] == [512.0]  # MiB
    assert 'id="stages-cpu"' not in _page(client_for(viewer))


def test_without_gpus_the_health_charts_say_why_they_are_empty(client_for, viewer, deployment):
    figures = _stages(client_for(viewer))["figures"]
    for key in ("health-gpu_temp", "health-gpu_frag"):
        assert figures[key]["data"] == []
        assert "no GPU on this host" in figures[key]["layout"]["annotations"][0]["text"]


def test_batch_tokens_per_step_says_no_data_yet_until_the_workers_export_it(client_for, viewer, deployment,
                                                                            seed_samples):
    figures = _stages(client_for(viewer))["figures"]
    assert "no data yet" in figures["stage-prefill-batch"]["layout"]["annotations"][0]["text"]
    assert "tandem_batch_tokens_per_step" in figures["stage-prefill-batch"]["layout"]["annotations"][0]["text"]
    seed_samples(deployment, "batch_tokens_per_step", [96.0, 128.0], role="prefill")
    figure = _stages(client_for(viewer))["figures"]["stage-prefill-batch"]
    assert [t["name"] for t in figure["data"]] == ["tokens prefill"]
    assert _value(_page(client_for(viewer)), "prefill:batch") == "128.0 tokens"


def test_an_objective_far_above_the_measured_p99_is_named_instead_of_flattening_the_chart(client_for, viewer,
                                                                                          deployment, seed_samples):
    seed_samples(deployment, "ttft_p99_seconds", [0.2, 0.3], role="prefill")  # the default objective is 10 s
    figure = _stages(client_for(viewer))["figures"]["stage-prefill-ttft"]
    assert "objective P99" not in {t["name"] for t in figure["data"]}
    assert "objective 10 s, far above" in figure["layout"]["title"]["text"]
