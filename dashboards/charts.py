"""Plotly figures for the dashboard, built server-side as plain figure dicts (the JSON plotly.js renders).

Pure functions: series in, figure out — no Django, no database — so they are unit-tested on their own and cost
microseconds (plotly's `graph_objects` validate every property and cost milliseconds per figure, which a page of
twelve charts refreshed every 5 s cannot afford; the tests check the dicts against `graph_objects` instead).

A series is `Series(name, points)` with points `[[unix_seconds, value], ...]` in time order. Every figure either has
traces with points or says why it has none (`empty_figure(reason)`): an operator must never wonder whether an empty
chart means "zero" or "no data".
"""
from __future__ import annotations

import html
import re
import zlib
from dataclasses import dataclass, field

MAX_POINTS = 500
FEW_POINTS = 20
# Status-neutral palette. A series' colour comes from what it is (colour_for), never from its position among the
# series drawn now: a worker keeps its colour when others come and go, in every chart and every refresh.
PALETTE = ("#2563eb", "#d97706", "#059669", "#7c3aed", "#db2777", "#0891b2", "#65a30d", "#dc2626", "#4b5563",
           "#ca8a04")
ROLE_COLOURS = {"prefill": PALETTE[0], "decode": PALETTE[1], "colocated": PALETTE[2], "gateway": PALETTE[3]}
# A rollout's two revisions: stable (or A) and the one tried (canary, or B).
VARIANT_COLOURS = {"stable": PALETTE[0], "a": PALETTE[0], "canary": PALETTE[1], "b": PALETTE[1]}
_WORKER_GROUP = re.compile(r"#(\d+)$")
GIB = 2 ** 30
MIB = 2 ** 20


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: list  # [[unix seconds, value], ...], oldest first
    dash: str = "solid"  # "solid" | "dot" | "dash": P50 dotted under a solid P99, for example
    group: str = ""  # series of one group share a colour (a role's P50 and P99); "" = the name
    # The largest value the source can report (a latency histogram's last finite bucket, dashboards.buckets): a
    # point there means "more than this", and its hover says so.
    top: float | None = None


@dataclass(frozen=True, slots=True)
class Axis:
    unit: str  # "seconds" | "ratio" | "bytes" | "tokens_per_second" | "requests_per_second" | "requests" | "cores"
    # | "tokens" | "celsius"
    title: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Scale:
    """How a unit is drawn: values are multiplied by `factor` and shown with `label`, after each tick when it is
    short (ms, s, %, GiB), else as the axis title (tokens/s); hovers always carry it."""

    factor: float
    label: str
    on_ticks: bool
    digits: str  # d3 format of a hovered value


def unit_scale(unit: str, max_value: float) -> Scale:
    """The scale of a chart whose largest value is `max_value` (in base units: seconds, ratio, bytes)."""
    if unit == "seconds":
        return Scale(1000.0, "ms", True, ",.1f") if max_value < 1 else Scale(1.0, "s", True, ",.2f")
    if unit == "ratio":
        return Scale(100.0, "%", True, ".1f")
    if unit == "bytes":
        return Scale(1 / GIB, "GiB", True, ",.2f") if max_value >= GIB else Scale(1 / MIB, "MiB", True, ",.0f")
    labels = {"tokens_per_second": "tokens/s", "requests_per_second": "req/s", "requests": "requests",
              "cores": "cores", "tokens": "tokens", "celsius": "°C"}
    return Scale(1.0, labels.get(unit, ""), False, ",.2f")


def colour_for(group: str) -> str:
    """A worker's series ("decode#17") by its id, a pool's ("decode#" or "decode") by its role, anything else by a
    stable hash of its name."""
    worker = _WORKER_GROUP.search(group)
    if worker:
        return PALETTE[int(worker.group(1)) % len(PALETTE)]
    role = group.rstrip("#")
    if role in ROLE_COLOURS:
        return ROLE_COLOURS[role]
    if group in VARIANT_COLOURS:
        return VARIANT_COLOURS[group]
    return PALETTE[zlib.crc32(group.encode()) % len(PALETTE)]


def downsample(points: list, max_points: int = MAX_POINTS) -> list:
    """At most `max_points` points: consecutive points are grouped into equal buckets and each bucket becomes its
    mean time and mean value. Spikes are averaged out a little, but a series of 17,280 points (a day of 5 s
    samples) keeps its shape in 500, and the browser draws 500 points per trace without effort."""
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, not {max_points}")
    num_points = len(points)
    if num_points <= max_points:
        return [list(p) for p in points]
    out = []
    for index in range(max_points):
        lo = index * num_points // max_points
        hi = (index + 1) * num_points // max_points
        bucket = points[lo:hi]
        out.append([sum(p[0] for p in bucket) / len(bucket), sum(p[1] for p in bucket) / len(bucket)])
    return out


def _ms(ts: float) -> int:
    # Milliseconds since the epoch: what a plotly date axis reads as UTC time. Half the bytes of ISO strings and
    # no strftime per point (a day of 13 charts is ~20,000 points every refresh).
    return int(ts * 1000)


def _tickformat(scale: Scale, max_value: float) -> str | None:
    """Rates in thousands read best as 12k; below that as plain numbers: d3's SI prefixes would write 0.3 as
    "300m", which reads as 300 million."""
    if scale.label not in ("tokens/s", "req/s"):
        return None
    return "~s" if max_value * scale.factor >= 1000 else ",~r"


def _axis_layout(axis: Axis, scale: Scale, *, min_value: float, max_value: float) -> dict:
    title = axis.title or ("" if scale.on_ticks else scale.label)
    layout: dict = {"title": {"text": title} if title else None, "rangemode": "tozero",
                    "gridcolor": "#e5e7eb", "zeroline": False, "automargin": True,
                    "tickformat": _tickformat(scale, max_value)}
    if min_value >= 0 and max_value == 0:
        # Plotly draws an all-zero series in the middle of -1..1; nothing measured here is negative.
        layout["range"] = [0, 1]
    if scale.on_ticks:
        layout["ticksuffix"] = scale.label if scale.label == "%" else f" {scale.label}"
    layout.update(axis.extra)
    return {key: value for key, value in layout.items() if value is not None}


def _hover(scale: Scale) -> str:
    unit = scale.label if scale.label == "%" else f" {scale.label}" if scale.label else ""
    return "%{fullData.name}: %{y:" + scale.digits + "}" + unit + "<br>%{x}<extra></extra>"


def _hover_above(top: float) -> str:
    return f"%{{fullData.name}}: > {top:g} s (the histogram's top bucket)<br>%{{x}}<extra></extra>"


def _base_layout(title: str, *, x_range: tuple[float, float] | None) -> dict:
    # One-line time ticks (the date would take a second line that collides with the legend); hover shows it all.
    # Seconds where the ticks are less than a minute apart (a short run or rollout, a zoom): "%H:%M" alone would
    # write the same minute under several ticks.
    xaxis: dict = {"type": "date", "gridcolor": "#e5e7eb", "automargin": True, "tickformat": "%H:%M",
                   "tickformatstops": [{"dtickrange": [None, 60_000], "value": "%H:%M:%S"},
                                       {"dtickrange": [60_000, 86_400_000], "value": "%H:%M"},
                                       {"dtickrange": [86_400_000, None], "value": "%m-%d"}],
                   "hoverformat": "%Y-%m-%d %H:%M:%S UTC"}
    if x_range is not None:
        xaxis["range"] = [_ms(x_range[0]), _ms(x_range[1])]
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 13}},
        "margin": {"l": 48, "r": 12, "t": 30, "b": 28},
        "height": 230,
        "showlegend": True,
        "legend": {"orientation": "h", "y": -0.18, "font": {"size": 10}},
        "hovermode": "x unified",
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": {"family": "system-ui, sans-serif", "size": 11, "color": "#1f2937"},
        "xaxis": xaxis,
        # uirevision keeps the user's zoom and hidden traces across Plotly.react refreshes.
        "uirevision": title,
    }


def line_figure(title: str, series: list[Series], axis: Axis, *, x_range: tuple[float, float] | None = None,
                empty_reason: str = "", max_points: int = MAX_POINTS) -> dict:
    """A time-series line chart; series without points are left out. With no points at all it is
    `empty_figure(empty_reason)`, so the reason is drawn where the lines would be."""
    drawn = [(item, downsample(item.points, max_points)) for item in series if item.points]
    if not drawn:
        return empty_figure(title, empty_reason or "no data in this time range", x_range=x_range)
    values = [p[1] for _, points in drawn for p in points]
    scale = unit_scale(axis.unit, max(abs(v) for v in values))
    traces = []
    above = set()
    for item, points in drawn:
        hover = _hover(scale)
        if item.top is not None and any(p[1] >= item.top for p in points):
            # Per point: those at the top bucket say "> 80 s" instead of a number they are not.
            hover = [_hover_above(item.top) if p[1] >= item.top else _hover(scale) for p in points]
            above.add(item.top)
        traces.append({
            "type": "scatter",
            # A line needs two points: a series that just started (or a sparse one) also gets markers.
            "mode": "lines" if len(points) >= FEW_POINTS else "lines+markers",
            "marker": {"size": 4},
            "name": item.name,
            "x": [_ms(p[0]) for p in points],
            "y": [p[1] * scale.factor for p in points],
            "line": {"width": 1.6, "color": colour_for(item.group or item.name), "dash": item.dash},
            "hovertemplate": hover,
        })
    layout = _base_layout(title, x_range=x_range)
    layout["yaxis"] = _axis_layout(axis, scale, min_value=min(values), max_value=max(values))
    if above:
        top = max(above)
        layout["annotations"] = [{"text": f"at {top:g} s: more than {top:g} s (top histogram bucket)",
                                  "xref": "paper", "yref": "paper", "x": 1, "y": 1, "xanchor": "right",
                                  "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": "#b45309"}}]
    return {"data": traces, "layout": layout}


def empty_figure(title: str, reason: str, *, x_range: tuple[float, float] | None = None) -> dict:
    """No traces, the reason written in the middle of the plot area."""
    layout = _base_layout(title, x_range=x_range)
    layout["showlegend"] = False
    layout["yaxis"] = {"visible": False}
    layout["annotations"] = [{"text": reason, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                              "showarrow": False, "font": {"size": 12, "color": "#6b7280"}}]
    return {"data": [], "layout": layout}


ERROR_COLOUR = "#b91c1c"


def error_figure(title: str, error: str, *, x_range: tuple[float, float] | None = None) -> dict:
    """No traces, and why the series could not be read (the metrics backend did not answer, or refused the query)
    written in red where the lines would be: an empty chart would read as "no traffic". `layout.meta.error`
    carries the message for the page's script and the tests."""
    figure = empty_figure(title, f"could not read the series:<br>{_wrapped(html.escape(error, quote=False))}",
                          x_range=x_range)
    figure["layout"]["annotations"][0]["font"]["color"] = ERROR_COLOUR
    figure["layout"]["meta"] = {"error": error}
    return figure


def _wrapped(text: str, width: int = 60) -> str:
    """Plotly draws an annotation on one line: break a long message at spaces every ~width characters."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join([*lines, line]) if line else "<br>".join(lines)


CHAOS_FILL = "rgba(220, 38, 38, 0.08)"  # a light red band: a fault was active, not an incident
CHAOS_LABEL = "#b91c1c"


def shade_windows(figure: dict, windows: list[dict]) -> dict:
    """The figure with a band over each window ({"start", "end": unix seconds, "label"}) behind its lines and a
    label at its top, so a chart shows the chaos fault beside what it caused. The figure is changed in place."""
    if not windows:
        return figure
    layout = figure["layout"]
    layout["shapes"] = layout.get("shapes", []) + [
        {"type": "rect", "xref": "x", "yref": "paper", "x0": _ms(window["start"]), "x1": _ms(window["end"]),
         "y0": 0, "y1": 1, "fillcolor": CHAOS_FILL, "line": {"width": 0}, "layer": "below"}
        for window in windows]
    layout["annotations"] = layout.get("annotations", []) + [
        {"text": window["label"], "xref": "x", "yref": "paper", "x": _ms(window["start"]), "y": 1,
         "xanchor": "left", "yanchor": "top", "showarrow": False, "font": {"size": 9, "color": CHAOS_LABEL}}
        for window in windows]
    return figure


def num_points(figure: dict) -> int:
    """Points drawn by a figure (0 for an empty state)."""
    return sum(len(trace.get("x", [])) for trace in figure.get("data", []))
