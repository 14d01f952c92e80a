"""Chart data of the deployment page: figures with points from the stored series, GPU or CPU panels depending on
the host, empty states that say why, ranges, and at most ~500 points per trace."""
from __future__ import annotations

import pytest

from tests.page_assets import foreign_assets


pytestmark = pytest.mark.django_db


def _charts(client, query=""):
    response = client.get(f"/deployments/demo/charts.json{query}")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    return response.json()


def _points(figure):
    return sum(len(trace["x"]) for trace in figure["data"])


def _created_ago(deployment, seconds: float) -> None:
    from datetime import timedelta

    from controlplane.models import Deployment

    deployment.created_at -= timedelta(seconds=seconds)
    Deployment.objects.filter(pk=deployment.pk).update(created_at=deployment.created_at)


def test_latency_charts_draw_p50_and_p99_of_each_role_from_the_stored_series(
        client_for, viewer, deployment, make_worker, seed_samples):
    _created_ago(deployment, 3600)
    make_worker(deployment, "decode")
    seed_samples(deployment, "ttft_p99_seconds", [0.2, 0.3, 0.25], role="gateway")
    seed_samples(deployment, "ttft_p50_seconds", [0.1, 0.1, 0.12], role="gateway")
    seed_samples(deployment, "ttft_p99_seconds", [0.15, 0.2, 0.18], role="prefill")
    data = _charts(client_for(viewer), "?range=15m")
    ttft = data["figures"]["ttft"]
    names = sorted(trace["name"] for trace in ttft["data"])
    assert names == ["P50 gateway", "P99 gateway", "P99 prefill"]
    p99 = next(t for t in ttft["data"] if t["name"] == "P99 gateway")
    assert p99["y"] == pytest.approx([200, 300, 250])  # below a second: drawn in milliseconds
    assert p99["hovertemplate"].startswith("%{fullData.name}: %{y:,.1f} ms")
    assert ttft["layout"]["yaxis"]["ticksuffix"] == " ms"
    assert data["range"] == "15m" and data["end"] - data["start"] == 900


def test_the_default_range_is_fifteen_minutes_or_the_life_of_a_younger_deployment(client_for, viewer,
                                                                                  deployment):
    client = client_for(viewer)
    _created_ago(deployment, 300)
    data = _charts(client)
    assert data["range"] == "15m"
    # A 5-minute-old deployment: its charts span its 5 minutes, not 15 (or an hour) of which most is empty.
    assert data["start"] == pytest.approx(deployment.created_at.timestamp(), abs=1)
    assert data["figures"]["ttft"]["layout"]["xaxis"]["range"][0] == pytest.approx(data["start"] * 1000, abs=1000)
    _created_ago(deployment, 3600)  # an older one: the full 15 minutes
    data = _charts(client)
    assert data["end"] - data["start"] == pytest.approx(900, abs=1)


def test_a_just_created_deployment_still_gets_a_two_minute_wide_range(client_for, viewer, deployment):
    data = _charts(client_for(viewer))
    assert data["end"] - data["start"] == pytest.approx(120, abs=1)


def test_per_worker_charts_draw_one_line_per_worker(client_for, viewer, deployment, make_worker, seed_samples):
    a, b = make_worker(deployment, "decode"), make_worker(deployment, "prefill")
    seed_samples(deployment, "kv_cache_usage_ratio", [0.1, 0.2], role="decode", worker=a)
    seed_samples(deployment, "kv_cache_usage_ratio", [0.3, 0.4], role="prefill", worker=b)
    kv = _charts(client_for(viewer))["figures"]["kv"]
    assert sorted(t["name"] for t in kv["data"]) == [f"decode #{a.pk}", f"prefill #{b.pk}"]


def test_a_cpu_only_host_gets_cpu_and_memory_charts_instead_of_gpu_ones(client_for, viewer, deployment,
                                                                       make_worker, seed_samples):
    worker = make_worker(deployment, "decode")  # on the `node` fixture: gpus == []
    seed_samples(deployment, "cpu_usage_ratio", [0.5, 0.7], role="decode", worker=worker, step_s=30)
    client = client_for(viewer)
    data = _charts(client)
    assert data["has_gpu"] is False
    assert "gpu_util" not in data["figures"] and "gpu_mem" not in data["figures"]
    assert _points(data["figures"]["cpu"]) == 2
    assert "no GPU on this host" in client.get("/deployments/demo/").content.decode()


def test_a_gpu_host_gets_gpu_charts(client_for, viewer, deployment, make_worker, seed_samples, node):
    node.gpus = [{"index": 0, "name": "NVIDIA H100", "memory_total_bytes": 80 * 2**30}]
    node.save()
    worker = make_worker(deployment, "decode", gpu_index=0)
    seed_samples(deployment, "gpu_utilization_ratio", [0.9], role="decode", worker=worker)
    client = client_for(viewer)
    data = _charts(client)
    assert data["has_gpu"] is True and "cpu" not in data["figures"]
    assert _points(data["figures"]["gpu_util"]) == 1
    page = client.get("/deployments/demo/").content.decode()
    assert "GPU 0 · NVIDIA H100" in page and 'id="no-gpu"' not in page


def test_empty_charts_say_why(client_for, viewer, deployment, make_worker):
    client = client_for(viewer)
    reason = lambda data: data["figures"]["ttft"]["layout"]["annotations"][0]["text"]  # noqa: E731
    assert reason(_charts(client)) == "no workers: scale a pool up to start one"
    make_worker(deployment, "decode")
    assert reason(_charts(client)).startswith("no samples yet: the scraper runs every")


def test_a_day_of_5_second_samples_is_drawn_with_at_most_500_points_per_trace(client_for, viewer, deployment,
                                                                              make_worker, seed_samples):
    make_worker(deployment, "decode")
    seed_samples(deployment, "qps", [float(i % 10) for i in range(17_280)], role="gateway")
    data = _charts(client_for(viewer), "?range=24h")
    qps = data["figures"]["qps"]["data"]
    # Samples older than the raw retention (6 h) are read as rollups: not written here, so 6 h are drawn.
    assert qps and all(0 < len(trace["x"]) <= 500 for trace in qps)


def test_an_unknown_range_falls_back_to_fifteen_minutes(client_for, viewer, deployment):
    assert _charts(client_for(viewer), "?range=1y")["range"] == "15m"


def test_the_page_loads_plotly_from_this_server_never_a_cdn(client_for, viewer, deployment):
    client = client_for(viewer)
    page = client.get("/deployments/demo/").content.decode()
    import re

    src = re.search(r'<script src="([^"]*plotly[^"]*)"', page).group(1)
    assert src.startswith("/assets/plotly-") and foreign_assets(page) == []
    response = client.get(src)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/javascript")
    assert b"plotly.js (basic" in response.content[:2000]
    # The partial bundle that draws what the pages use (scatter, shapes, annotations), not the full 4.8 MB one;
    # gzipped for a browser that accepts it.
    assert len(response.content) < 1_500_000
    zipped = client.get(src, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert zipped["Content-Encoding"] == "gzip" and len(zipped.content) < 500_000
    assert client.get("/assets/plotly-0.0.0.min.js").status_code == 404
