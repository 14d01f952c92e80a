"""What a chaos run's page shows beside its report (controlplane.chaos.report): one chart per check of the
hypothesis over the run, with a margin before and after, and the fault windows shaded as on the deployment page
(dashboards.chaos.chaos_windows, charts.shade_windows).

A chart draws three things: the value the driver judged at each pass (the run's baseline, then its timeline: the
numbers the verdict was reached on); the check's limit; and, where the metric is a stored series (the gateway's
error ratio and latency P99s, a pool's series), that series from the scraper over the whole range, which is what
shows the margins: the driver judges only while the run is active, and the gateway samples it judged on are pruned
minutes later."""
from __future__ import annotations

import logging
import time

from controlplane.chaos.hypothesis import judge_check
from controlplane.observability.catalog import METRICS
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import SeriesQuery, auto_step
from dashboards.buckets import histogram_top
from dashboards.chaos import chaos_windows
from dashboards.charts import Axis, Series, line_figure, shade_windows

log = logging.getLogger(__name__)

MARGIN_S = 60.0  # drawn before the run's start and after its end
BOUNDS = ("max", "min", "max_baseline_ratio")


def _unit(metric: str) -> str:
    if metric.endswith("_seconds"):
        return "seconds"
    if metric.endswith("_ratio"):
        return "ratio"
    if metric.endswith("_bytes"):
        return "bytes"
    if metric == "qps":
        return "requests_per_second"
    return "requests" if metric == "requests" else "workers"


def check_rows(run) -> list[dict]:
    """Each check of the hypothesis with its bound, limit and its value before, at its worst during and after the
    faults: [{"metric", "role", "bound", "op", "limit", "limit_text", "ratio", "window_s", "before", "during",
    "after"}], each phase {"value", "holds"} (during also its passes and how many failed) or None."""
    checks = run.spec.get("hypothesis", [])
    baselines = run.baseline.get("values") or [None] * len(checks)
    phases = {"during": [e for e in run.timeline if e["phase"] == "during"],
              "after": [e for e in run.timeline if e["phase"] == "after"]}
    rows = []
    for index, check in enumerate(checks):
        bound = next(key for key in BOUNDS if key in check)
        before = judge_check(check, baselines[index], baselines[index])
        row = {"metric": check["metric"], "role": check["role"], "bound": bound,
               "op": "≥" if bound == "min" else "≤", "limit": before["limit"], "window_s": check.get("window_s"),
               "limit_text": "–" if before["limit"] is None else f"{before['limit']:.4g}",
               "ratio": check.get("max_baseline_ratio"),
               "before": {"value": before["value"], "holds": before["holds"]}}
        # During: the worst value judged, and how many of the passes held.
        during = [judge_check(check, entry["values"][index], baselines[index]) for entry in phases["during"]]
        values = [judged["value"] for judged in during if judged["value"] is not None]
        failed = sum(1 for judged in during if not judged["holds"])
        row["during"] = None if not during else {
            "value": (min if bound == "min" else max)(values) if values else None, "holds": failed == 0,
            "passes": len(during), "failed": failed}
        after = judge_check(check, phases["after"][-1]["values"][index], baselines[index]) if phases["after"] \
            else None
        row["after"] = None if after is None else {"value": after["value"], "holds": after["holds"]}
        rows.append(row)
    return rows


def run_range(run, *, now: float) -> tuple[float, float]:
    end = run.finished_at.timestamp() if run.finished_at else now
    return run.started_at.timestamp() - MARGIN_S, min(end + MARGIN_S, now)


def run_figures(run, rows: list[dict], *, now: float | None = None) -> list[dict]:
    """One figure per check ({"key": "check-<i>", "data", "layout"}), in the deployment page's chart style."""
    now = time.time() if now is None else now
    start, end = run_range(run, now=now)
    checks = run.spec.get("hypothesis", [])
    baselines = run.baseline.get("values") or [None] * len(checks)
    stored = [index for index, check in enumerate(checks) if check["metric"] in METRICS]
    step = auto_step(start, end)
    queries = [SeriesQuery(metric=checks[i]["metric"], deployment_id=run.deployment_id, role=checks[i]["role"],
                           worker=None, start=start, end=end, step=step) for i in stored]
    try:
        found = dict(zip(stored, reader().query_range(queries, now=now)))
    except MetricsUnavailable as error:
        # The values the run judged are its own rows: they are drawn without the scraped series around them.
        log.info("chaos run %s: no scraped series for its report: %s", run.pk, error)
        found = {}
    windows = chaos_windows(run.deployment, start=start, end=end)
    figures = []
    for index, (check, row) in enumerate(zip(checks, rows)):
        judged = [[run.baseline["at"], baselines[index]]] if run.baseline.get("at") else []
        judged += [[entry["t"], entry["values"][index]] for entry in run.timeline]
        series = [Series("judged by the run", [p for p in judged if p[1] is not None], group="judged")]
        if index in found:
            points = [p for item in found[index][1] for p in item["points"]]
            series.append(Series(f"{check['metric']} ({check['role']}), scraped", sorted(points), "dot",
                                 group=f"{check['role']}#", top=histogram_top(check["metric"])))
        if row["limit"] is not None:
            series.append(Series(f"limit {row['op']} {row['limit']:.4g}",
                                 [[start, row["limit"]], [end, row["limit"]]], "dash", group="limit"))
        title = f"{check['metric']} ({check['role']}) {row['op']} {row['limit']:.4g}" if row["limit"] is not None \
            else f"{check['metric']} ({check['role']})"
        figure = line_figure(title, series, Axis(_unit(check["metric"])), x_range=(start, end),
                             empty_reason="no value of this check yet")
        figures.append({"key": f"check-{index}", **shade_windows(figure, windows)})
    return figures
