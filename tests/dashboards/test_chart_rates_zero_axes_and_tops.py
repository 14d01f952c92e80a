"""What the charts and values must not say: 0.3 req/s as "300m" (SI milli, read as 300 million), an all-zero error
ratio on an axis from −1 to 1, or a TTFT beyond the workers' last histogram bucket (80 s) as exactly 80 s."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboards.buckets import histogram_top
from dashboards.charts import Axis, Series, line_figure
from dashboards.templatetags.dash import metric_value

NOW = 1_700_000_000.0


def test_rates_below_a_thousand_are_plain_numbers_on_the_axis_not_si_prefixes():
    slow = line_figure("QPS", [Series("QPS gateway", [[NOW - 5, 0.3], [NOW, 0.25]])], Axis("requests_per_second"))
    assert slow["layout"]["yaxis"]["tickformat"] == ",~r"  # 0.3, never "300m"
    fast = line_figure("tokens", [Series("out", [[NOW, 12_000.0]])], Axis("tokens_per_second"))
    assert fast["layout"]["yaxis"]["tickformat"] == "~s"  # 12k
    go.Figure(slow), go.Figure(fast)


def test_an_all_zero_series_sits_on_an_axis_from_zero():
    figure = line_figure("Error ratio", [Series("errors", [[NOW - 5, 0.0], [NOW, 0.0]])], Axis("ratio"))
    assert figure["layout"]["yaxis"]["range"] == [0, 1]
    go.Figure(figure)
    moving = line_figure("Error ratio", [Series("errors", [[NOW - 5, 0.0], [NOW, 0.02]])], Axis("ratio"))
    assert "range" not in moving["layout"]["yaxis"] and moving["layout"]["yaxis"]["rangemode"] == "tozero"


def test_latency_quantiles_know_their_histograms_top_bucket():
    assert (histogram_top("ttft_p99_seconds"), histogram_top("ttft_p50_seconds")) == (80.0, 80.0)
    assert (histogram_top("itl_p99_seconds"), histogram_top("e2e_p99_seconds")) == (5.0, 320.0)
    assert histogram_top("qps") is None and histogram_top("kv_cache_usage_ratio") is None


def test_a_ttft_at_the_top_bucket_is_written_as_more_than_80_s():
    assert metric_value(80.0, "ttft_p99_seconds") == "> 80 s"
    assert metric_value(79.5, "ttft_p99_seconds") == "79.50 s"
    assert metric_value(5.0, "itl_p99_seconds") == "> 5 s"
    assert metric_value(80.0, "e2e_p99_seconds") == "80.00 s"  # end-to-end goes up to 320 s


def test_a_chart_hovers_more_than_80_s_at_the_top_bucket_and_says_so():
    series = Series("P99 gateway", [[NOW - 10, 30.0], [NOW - 5, 80.0], [NOW, 80.0]], top=80.0)
    figure = line_figure("Time to first token", [series], Axis("seconds"))
    go.Figure(figure)
    hovers = figure["data"][0]["hovertemplate"]
    assert "> 80 s" not in hovers[0] and all("> 80 s" in hover for hover in hovers[1:])
    assert "more than 80 s" in figure["layout"]["annotations"][0]["text"]
    below = line_figure("TTFT", [Series("P99 gateway", [[NOW, 30.0]], top=80.0)], Axis("seconds"))
    assert isinstance(below["data"][0]["hovertemplate"], str) and "annotations" not in below["layout"]


def test_the_deployment_page_writes_a_capped_ttft_as_more_than_80_s(deployment, seed_samples, make_worker,
                                                                    client_for, viewer):
    make_worker(deployment, "prefill")
    seed_samples(deployment, "ttft_p99_seconds", [60.0, 80.0], role="prefill")
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    cell = html[html.index('data-stage-value="prefill:ttft"'):][:120]
    assert "&gt; 80 s" in cell
    figures = client_for(viewer).get("/deployments/demo/stages.json").json()["figures"]
    p99 = next(t for t in figures["stage-prefill-ttft"]["data"] if t["name"] == "P99 prefill")
    hovers = p99["hovertemplate"]
    assert "> 80 s" in hovers[-1]
