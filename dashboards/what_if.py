"""What the what-if page shows of a what-if report (controlplane.replay.whatif): the change its form asks for, the
two fleets and the two results side by side, and charts of the two timelines.

Pure functions: the form's fields and the report in, the change, table rows and plotly figure dicts out.

The form shows every field filled with the fleet as it stands; only a field the operator changed goes into the change
(the what-if then says what it altered, and its JSON is the one an API client would send). A value that is not a
number is passed on as typed, so that the what-if's own check names the field in its 400: the page and the API
refuse the same things with the same words.
"""
from __future__ import annotations

import math

from controlplane.errors import invalid
from dashboards.charts import PALETTE, Axis, colour_for, downsample, empty_figure, unit_scale

BEFORE_COLOUR, AFTER_COLOUR, OBJECTIVE_COLOUR = PALETTE[8], PALETTE[0], PALETTE[7]
SWITCHES = {"on": True, "off": False}
ROUTINGS = ("least_loaded", "prefix")
X_TITLE = "seconds from the window's first request"
# (key, label, the value in a result, its unit, whether less is better).
FIGURES = (
    ("attainment", "SLO attainment", lambda r: r["slo_attainment"], "ratio", False),
    ("ttft_p50", "TTFT P50", lambda r: r["ttft_s"]["p50"], "seconds", True),
    ("ttft_p99", "TTFT P99", lambda r: r["ttft_s"]["p99"], "seconds", True),
    ("itl_p50", "ITL P50", lambda r: r["itl_s"]["p50"], "seconds", True),
    ("itl_p99", "ITL P99", lambda r: r["itl_s"]["p99"], "seconds", True),
    ("e2e_p50", "End-to-end P50", lambda r: r["e2e_s"]["p50"], "seconds", True),
    ("e2e_p99", "End-to-end P99", lambda r: r["e2e_s"]["p99"], "seconds", True),
    ("queue_wait_p99", "Queue wait P99", lambda r: r["queue_wait_s"]["p99"], "seconds", True),
    ("served", "Served", lambda r: r["served"], "requests", False),
    ("shed", "Shed", lambda r: sum(r["shed"].values()), "requests", True),
    ("goodput_rps", "Goodput", lambda r: r["goodput_rps"], "requests_per_second", False),
    ("goodput_tokens", "Goodput tokens", lambda r: r["goodput_tokens_per_s"], "tokens_per_second", False),
    ("worker_hours", "Worker-hours", lambda r: r["worker_hours"]["total"], "hours", True),
)


def _typed(raw, kind):
    """A posted number as `kind`; blank is None; anything else as typed (the what-if names it in its 400)."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        return raw


def _switch(raw):
    raw = (raw or "").strip()
    return SWITCHES.get(raw, raw or None)


def change_from_form(form, current: dict) -> dict:
    """The change of the posted `form` against the fleet as it stands (`current`: Fleet.describe()): each field whose
    value differs, nothing for a field left blank or as it was."""
    change: dict = {}
    pools = {}
    for role, replicas in current["replicas"].items():
        value = _typed(form.get(f"replicas_{role}"), int)
        if value is not None and value != replicas:
            pools[role] = {"replicas": value}
    if pools:
        change["pools"] = pools
    autoscale = _switch(form.get("autoscale"))
    if autoscale is not None and autoscale != current["autoscale"]:
        change["autoscaling"] = {"enabled": autoscale}
    max_queued = _typed(form.get("max_queued"), int)
    if max_queued is not None and max_queued != current["admission"]["max_queued"]:
        change["admission"] = {"max_queued": max_queued}
    caching = _switch(form.get("prefix_caching"))
    if caching is not None and caching != current["prefix_caching"]:
        change["prefix_caching"] = caching
    routing = (form.get("routing") or "").strip()
    if routing and routing != current["routing"]:
        change["routing"] = routing
    rate = _typed(form.get("traffic_rate"), float)
    if rate is not None and rate != current["traffic_rate"]:
        change["traffic"] = {"rate": rate}
    return change


def window_from_form(form) -> tuple[str, float | None, float | None]:
    """The trace (default the recorded one) and since/until (seconds from its start; blank: its whole span)."""
    seconds = {}
    for name in ("since", "until"):
        value = _typed(form.get(name), float)
        if isinstance(value, str) or (value is not None and not math.isfinite(value)):
            raise invalid(f"{name} must be seconds from the trace's start, not {value!r}", field=name)
        seconds[name] = value
    return (form.get("trace") or "").strip() or "recorded", seconds["since"], seconds["until"]


def value_text(value, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "seconds":
        return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.2f} s"
    if unit == "ratio":
        return f"{value * 100:.2f} %"
    if unit == "requests":
        return f"{value:,d}"
    if unit == "hours":
        return f"{value:,.4g} h"
    return f"{value:,.2f} {unit_scale(unit, value).label}"


def verdict_texts(report: dict) -> dict:
    """The verdict's attainments and target as texts, and the objectives they are judged against."""
    verdict, objectives = report["verdict"], report["objectives"]
    return {"before": value_text(verdict["attainment_before"], "ratio"),
            "after": value_text(verdict["attainment_after"], "ratio"),
            "target": value_text(objectives["attainment_target"], "ratio"),
            "ttft": value_text(objectives["ttft_p99_s"], "seconds"),
            "itl": value_text(objectives["itl_p99_s"], "seconds")}


def _judged(before, after, lower_is_better: bool) -> str:
    """"better", "worse" or "" (the same, or a side without a value)."""
    if before is None or after is None or math.isclose(before, after, rel_tol=1e-3, abs_tol=1e-9):
        return ""
    return "better" if (after < before) == lower_is_better else "worse"


def figure_rows(report: dict) -> list[dict]:
    """The table of before/after figures: [{"key", "label", "before", "after", "judged"}], texts with units."""
    rows = []
    for key, label, read, unit, lower_is_better in FIGURES:
        before, after = read(report["before"]), read(report["after"])
        rows.append({"key": key, "label": label, "before": value_text(before, unit),
                     "after": value_text(after, unit), "judged": _judged(before, after, lower_is_better)})
    return rows


def _switch_text(value: bool) -> str:
    return "on" if value else "off"


def fleet_rows(before: dict, after: dict) -> list[dict]:
    """The two fleets (Fleet.describe()) as rows: [{"label", "before", "after", "changed"}]."""
    pairs = [(f"{role} replicas", before["replicas"][role], after["replicas"][role]) for role in before["replicas"]]
    pairs += [("autoscaler", _switch_text(before["autoscale"]), _switch_text(after["autoscale"])),
              ("admission max_queued", before["admission"]["max_queued"], after["admission"]["max_queued"]),
              ("prefix caching", _switch_text(before["prefix_caching"]), _switch_text(after["prefix_caching"])),
              ("routing", before["routing"], after["routing"]),
              ("traffic rate", f"{before['traffic_rate']:g}×", f"{after['traffic_rate']:g}×")]
    return [{"label": label, "before": str(b), "after": str(a), "changed": b != a} for label, b, a in pairs]


def _bucket_s(timeline: list[dict]) -> float:
    return timeline[1]["start_s"] - timeline[0]["start_s"] if len(timeline) > 1 else 10.0


def _line(name: str, points: list, colour: str, *, dash: str = "solid", factor: float = 1.0,
          step: bool = False) -> dict:
    points = downsample(points)
    return {"type": "scatter", "mode": "lines" if len(points) > 1 else "lines+markers", "name": name,
            "x": [p[0] for p in points], "y": [p[1] * factor for p in points], "marker": {"size": 4},
            "line": {"width": 1.6, "color": colour, "dash": dash, **({"shape": "hv"} if step else {})},
            "hovertemplate": "%{fullData.name}: %{y}<br>%{x:.0f} s<extra></extra>"}


def _figure(key: str, title: str, lines: list[tuple], axis: Axis, empty_reason: str) -> dict:
    """A chart over the window's seconds of `lines` [(name, points, colour, dash, step)], the lines without points
    left out; with none at all the reason is drawn instead."""
    drawn = [line for line in lines if line[1]]
    if not drawn:
        return {"key": key, **empty_figure(title, empty_reason)}
    top = max(abs(p[1]) for line in drawn for p in line[1])
    scale = unit_scale(axis.unit, top)
    traces = [_line(name, points, colour, dash=dash, factor=scale.factor, step=step)
              for name, points, colour, dash, step in drawn]
    title_y = axis.title or ("" if scale.on_ticks else scale.label)
    yaxis = {"rangemode": "tozero", "gridcolor": "#e5e7eb", "zeroline": False, "automargin": True,
             "title": {"text": title_y}}
    if scale.on_ticks:
        yaxis["ticksuffix"] = scale.label if scale.label == "%" else f" {scale.label}"
    if top == 0:
        yaxis["range"] = [0, 1]  # plotly draws an all-zero line in the middle of -1..1
    layout = {"title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 13}},
              "margin": {"l": 48, "r": 12, "t": 30, "b": 28}, "height": 260, "showlegend": True,
              "legend": {"orientation": "h", "y": -0.3, "font": {"size": 10}}, "hovermode": "x unified",
              "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
              "font": {"family": "system-ui, sans-serif", "size": 11, "color": "#1f2937"},
              "xaxis": {"title": {"text": X_TITLE, "font": {"size": 10}}, "gridcolor": "#e5e7eb",
                        "automargin": True, "rangemode": "tozero"},
              "yaxis": yaxis}
    return {"key": key, "data": traces, "layout": layout}


def _steps(timeline: list[dict], read) -> list:
    """One step per interval, from its start to its end: the last interval's value is held to its end too."""
    points = [[t["start_s"], read(t)] for t in timeline]
    return points + [[timeline[-1]["start_s"] + _bucket_s(timeline), points[-1][1]]] if points else points


def timeline_figures(report: dict) -> list[dict]:
    """Three charts of the two timelines: TTFT P99 per interval before and after against the objective; pool sizes
    per role; arrivals and shed requests per second (before dotted, after solid). With the traffic rate changed the
    after side's seconds are the sped-up (or slowed) replay's."""
    before, after = report["before"]["timeline"], report["after"]["timeline"]
    sides = (("before", before, BEFORE_COLOUR, "dot"), ("after", after, AFTER_COLOUR, "solid"))
    end = max((t["start_s"] + _bucket_s(timeline) for _, timeline, _, _ in sides for t in timeline[-1:]),
              default=0.0)
    ttft = [(f"TTFT P99 {side}", [[t["start_s"] + _bucket_s(timeline) / 2, t["ttft_p99_s"]] for t in timeline
                                  if t["ttft_p99_s"] is not None], colour, "solid", False)
            for side, timeline, colour, _ in sides]
    objective = report["objectives"]["ttft_p99_s"]
    if objective is not None and any(line[1] for line in ttft):
        ttft.append((f"objective {objective:g} s", [[0.0, objective], [end, objective]], OBJECTIVE_COLOUR, "dash",
                     False))
    # The after lines last, over the before ones, and of those a pool the change resized last of all: two pools of
    # one size draw one line over the other.
    roles = sorted({role for _, timeline, _, _ in sides for t in timeline for role in t["replicas"]},
                   key=lambda role: ([t["replicas"].get(role) for t in before] !=
                                     [t["replicas"].get(role) for t in after], role))
    replicas = [(f"{role} {side}", _steps(timeline, lambda t, role=role: t["replicas"].get(role, 0)),
                 colour_for(role), dash, True) for side, timeline, _, dash in sides for role in roles]
    traffic = []
    for side, timeline, colour, dash in sides:
        per_s = 1 / _bucket_s(timeline)
        traffic.append((f"arrivals {side}", _steps(timeline, lambda t: t["arrivals"] * per_s), colour, dash, True))
        traffic.append((f"shed {side}", _steps(timeline, lambda t: t["shed"] * per_s), OBJECTIVE_COLOUR, dash,
                        True))
    return [
        _figure("ttft", "TTFT P99 per interval", ttft, Axis("seconds"), "no first token in this window"),
        _figure("replicas", "Replicas per pool", replicas, Axis("workers", title="replicas"), "no pool"),
        _figure("traffic", "Arrivals and shed requests", traffic, Axis("requests_per_second"), "no request"),
    ]
