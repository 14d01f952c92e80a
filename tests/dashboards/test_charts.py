"""dashboards.charts: pure figure builders (no database), checked against plotly's own figure validation."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest

from dashboards.charts import MAX_POINTS, Axis, Series, downsample, empty_figure, line_figure, num_points


def test_downsample_keeps_short_series_unchanged():
    points = [[float(i), float(i * i)] for i in range(10)]
    assert downsample(points, 500) == points


def test_downsample_turns_a_day_of_5_second_samples_into_at_most_500_bucket_means():
    points = [[float(i * 5), float(i % 100)] for i in range(17_280)]
    out = downsample(points, 500)
    assert len(out) == 500
    # Buckets cover everything in order: first and last bucket means sit inside the range, times increase.
    assert out[0][0] >= 0 and out[-1][0] <= points[-1][0]
    assert all(a[0] < b[0] for a, b in zip(out, out[1:]))
    # Each bucket is the mean of ~34.56 consecutive points of a 0..99 saw-tooth: between 0 and 99.
    assert all(0 <= p[1] <= 99 for p in out)
    assert sum(p[1] for p in out) / len(out) == pytest.approx(49.5, abs=1.0)


def test_downsample_of_a_constant_series_is_the_constant():
    out = downsample([[float(i), 7.0] for i in range(1234)], 100)
    assert len(out) == 100 and {p[1] for p in out} == {7.0}


def test_downsample_refuses_zero_points():
    with pytest.raises(ValueError):
        downsample([[0.0, 1.0]], 0)


def test_line_figure_is_a_valid_plotly_figure_with_one_trace_per_series_that_has_points():
    now = 1_700_000_000.0
    series = [Series("P99 gateway", [[now - 10, 0.2], [now - 5, 0.3]]),
              Series("P50 gateway", [[now - 10, 0.1], [now - 5, 0.15]], dash="dot"),
              Series("P99 prefill", [])]
    figure = line_figure("Time to first token", series, Axis("seconds"), x_range=(now - 60, now))
    go.Figure(figure)  # raises on any property plotly does not know
    assert [t["name"] for t in figure["data"]] == ["P99 gateway", "P50 gateway"]
    assert figure["data"][1]["line"]["dash"] == "dot"
    # Without groups each series has its own colour; a group (one role's P50 and P99) shares one.
    assert figure["data"][0]["line"]["color"] != figure["data"][1]["line"]["color"]
    grouped = line_figure("TTFT", [Series("P50 gateway", [[now, 0.1]], "dot", group="gateway"),
                                   Series("P99 gateway", [[now, 0.2]], group="gateway"),
                                   Series("P99 prefill", [[now, 0.3]], group="prefill")], Axis("seconds"))
    colours = [trace["line"]["color"] for trace in grouped["data"]]
    assert colours[0] == colours[1] != colours[2]
    assert figure["data"][0]["y"] == pytest.approx([200, 300])  # below a second: milliseconds
    assert figure["layout"]["yaxis"]["ticksuffix"] == " ms"
    assert figure["data"][0]["x"][0] == 1_699_999_990_000  # epoch ms on a date axis: plotly reads it as UTC time
    assert figure["layout"]["xaxis"]["type"] == "date"
    assert num_points(figure) == 4


def test_a_series_with_few_points_gets_markers_so_a_single_point_is_visible():
    few = line_figure("QPS", [Series("QPS gateway", [[1.0, 2.0]])], Axis("requests_per_second"))
    many = line_figure("QPS", [Series("QPS gateway", [[float(i), 2.0] for i in range(100)])],
                       Axis("requests_per_second"))
    assert few["data"][0]["mode"] == "lines+markers" and many["data"][0]["mode"] == "lines"


def test_line_figure_downsamples_each_trace_to_the_limit():
    points = [[float(i), 1.0] for i in range(5000)]
    figure = line_figure("QPS", [Series("QPS gateway", points)], Axis("requests_per_second"))
    assert len(figure["data"][0]["x"]) == MAX_POINTS


def test_a_figure_without_points_says_why_it_is_empty():
    figure = line_figure("KV cache usage per worker", [Series("decode #3", [])], Axis("ratio"),
                         empty_reason="no workers: scale a pool up to start one")
    go.Figure(figure)
    assert figure["data"] == [] and num_points(figure) == 0
    assert figure["layout"]["annotations"][0]["text"] == "no workers: scale a pool up to start one"


def _unit(figure) -> tuple[list, str, str, str]:
    """(y values, tick suffix, axis title, hover template) of a one-trace figure."""
    yaxis = figure["layout"]["yaxis"]
    return (figure["data"][0]["y"], yaxis.get("ticksuffix", ""), yaxis.get("title", {}).get("text", ""),
            figure["data"][0]["hovertemplate"])


@pytest.mark.parametrize("unit, value, y, suffix, title, hover", [
    ("seconds", 0.25, 250, " ms", "", "%{y:,.1f} ms"),
    ("seconds", 1.5, 1.5, " s", "", "%{y:,.2f} s"),
    ("ratio", 0.125, 12.5, "%", "", "%{y:.1f}%"),
    ("bytes", 3 * 2**30, 3, " GiB", "", "%{y:,.2f} GiB"),
    ("bytes", 300 * 2**20, 300, " MiB", "", "%{y:,.0f} MiB"),
    ("tokens_per_second", 42.0, 42, "", "tokens/s", "%{y:,.2f} tokens/s"),
    ("requests_per_second", 2.0, 2, "", "req/s", "%{y:,.2f} req/s"),
    ("requests", 3.0, 3, "", "requests", "%{y:,.2f} requests"),
    ("cores", 0.9, 0.9, "", "cores", "%{y:,.2f} cores"),
])
def test_values_carry_their_unit_on_the_axis_and_in_the_hover(unit, value, y, suffix, title, hover):
    figure = line_figure("x", [Series("s", [[1.0, value]])], Axis(unit))
    go.Figure(figure)
    values, tick_suffix, axis_title, template = _unit(figure)
    assert values == [pytest.approx(y)] and tick_suffix == suffix and axis_title == title
    assert template == "%{fullData.name}: " + hover + "<br>%{x}<extra></extra>"


def test_a_worker_keeps_its_colour_when_other_workers_come_and_go():
    def colours(worker_ids):
        series = [Series(f"decode #{wid}", [[1.0, 0.5]], group=f"decode#{wid}") for wid in worker_ids]
        figure = line_figure("KV", series, Axis("ratio"))
        return {trace["name"]: trace["line"]["color"] for trace in figure["data"]}

    before = colours([3, 4, 5])
    after = colours([4, 5, 6])  # worker 3 was replaced by worker 6: 4 and 5 moved up a place
    assert after["decode #4"] == before["decode #4"] and after["decode #5"] == before["decode #5"]
    assert len(set(before.values())) == 3


def test_a_pool_series_has_its_role_colour_in_every_chart():
    first = line_figure("TTFT", [Series("P99 gateway", [[1.0, 0.2]], group="gateway#"),
                                 Series("P99 prefill", [[1.0, 0.1]], group="prefill#")], Axis("seconds"))
    second = line_figure("QPS", [Series("QPS prefill", [[1.0, 2.0]], group="prefill#")], Axis("requests_per_second"))
    assert first["data"][1]["line"]["color"] == second["data"][0]["line"]["color"]
    assert first["data"][0]["line"]["color"] != first["data"][1]["line"]["color"]
    go.Figure(empty_figure("x", "why"))
