"""The deployment page's stage columns: prefill | decode side by side, each with its own indicators as charts and
current values (one column with both sets for a colocated deployment), and the GPU health charts (temperature,
allocator fragmentation) below them.

Prefill: TTFT, prompt tokens/s, queue length, batch tokens per step, compute utilisation, and its roofline
efficiency (matmul FLOP/s over the host's peak, inference.roofline). Decode: inter-token latency, generated tokens/s,
running sequences, KV cache usage, memory, and its roofline efficiency (weight bytes per step over step time times
the host's read bandwidth). On a GPU host compute and memory are NVML's
series; on a CPU host they are the worker processes' CPU use per thread (process_cpu_seconds_total's rate divided
by the threads the revision gives each worker) and resident memory, and the page says so. Latency charts carry the
deployment's objective as a dashed line.

Series and values are read through the metrics backend's reader (observability.reader); when it does not answer,
every chart is drawn as that error and every value reads "unavailable", never as an empty chart or "–" (no data).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from controlplane.models import DeploymentMode, Worker
from controlplane.models.workers import LIVE_STATUSES
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import SeriesQuery, as_unix, auto_step
from controlplane.services.objectives import objectives_merge
from dashboards.buckets import histogram_top
from dashboards.chaos import chaos_windows
from dashboards.charts import Axis, Series, empty_figure, error_figure, line_figure, shade_windows
from dashboards.panels import RANGES, Line, deployment_has_gpu, empty_reason, range_start
from dashboards.templatetags.dash import metric_value

VALUE_WINDOW_S = 60
UNAVAILABLE = "unavailable"  # a value the metrics backend could not give (not "–": no data)
# Plotly draws an annotation on one line unless told: <br> keeps the reason inside a narrow chart.
BATCH_ABSENT = ("no data yet: the workers export no<br>tandem_batch_tokens_per_step histogram<br>"
                "(tokens fed per engine step), or took no step")
PREFIX_ABSENT = ("no data yet: no prompt was admitted,<br>or the workers run without prefix caching<br>"
                 "(tandem_prefix_cache_*_tokens_total)")
SPEC_ABSENT = ("no drafts: the revision has no speculative<br>setting, or its workers drafted nothing yet")
NO_GPU = "no GPU on this host:<br>workers export these series<br>only on a GPU host"
ROOFLINE_ABSENT = ("no data yet: the stage has run no step, or its node<br>has not measured its host (the node "
                   "page),<br>or the workers are simulated")
# An objective far above the measured P99 would flatten its line to the floor: below this share of the objective
# the objective is named in the title instead of drawn.
OBJECTIVE_DRAWN_ABOVE = 0.25


@dataclass(frozen=True, slots=True)
class Indicator:
    key: str
    title: str
    unit: str  # a charts.Axis unit
    lines: tuple[Line, ...]
    per_worker: bool = False
    objective: str = ""  # a Deployment.objectives key drawn as a dashed line
    value_metric: str = ""  # the pool aggregate shown as the current value ("" = the last line's metric)
    value_unit: str = ""  # how the value is written (dash.metric_value's units); "" = the metric's own
    empty: str = ""  # why the chart can be empty, when that is not "no samples"
    per_thread: bool = False  # values divided by the worker's threads (CPU utilisation)


def _latency(key, title, prefix, objective):
    return Indicator(key, title, "seconds", (Line(f"{prefix}_p50_seconds", "P50", "dot"),
                                             Line(f"{prefix}_p99_seconds", "P99")), objective=objective)


def stage_indicators(stage: str, *, has_gpu: bool) -> tuple[Indicator, ...]:
    """The indicators of "prefill" or "decode" on this kind of host."""
    if stage == "prefill":
        compute = (Indicator("compute", "GPU utilisation per worker", "ratio", (Line("gpu_utilization_ratio", ""),),
                             per_worker=True) if has_gpu else
                   Indicator("compute", "CPU utilisation per worker (CPU host: per thread)", "ratio",
                             (Line("cpu_usage_ratio", ""),), per_worker=True, per_thread=True))
        return (
            _latency("ttft", "Time to first token (prefill)", "ttft", "ttft_p99_seconds"),
            Indicator("prompt_tokens", "Prompt tokens per second", "tokens_per_second",
                      (Line("prompt_tokens_per_second", "in"),)),
            Indicator("queue", "Queue length (waiting requests)", "requests", (Line("requests_waiting", "waiting"),)),
            Indicator("batch", "Batch tokens per step (mean)", "tokens", (Line("batch_tokens_per_step", "tokens"),),
                      empty=BATCH_ABSENT),
            Indicator("prefix_cache", "Prefix cache hit rate per worker (prompt tokens found cached)", "ratio",
                      (Line("prefix_cache_hit_ratio", ""),), per_worker=True, empty=PREFIX_ABSENT),
            compute,
            Indicator("prefill_roofline", "Prefill roofline per worker (matmul FLOP/s ÷ the host's peak)", "ratio",
                      (Line("prefill_roofline_ratio", ""),), per_worker=True, empty=ROOFLINE_ABSENT),
        )
    memory = (Indicator("memory", "GPU memory per worker", "bytes", (Line("gpu_memory_used_bytes", ""),),
                        per_worker=True) if has_gpu else
              Indicator("memory", "Resident memory per worker (CPU host)", "bytes",
                        (Line("resident_memory_bytes", ""),), per_worker=True))
    return (
        _latency("itl", "Inter-token latency (decode)", "itl", "itl_p99_seconds"),
        Indicator("gen_tokens", "Generated tokens per second", "tokens_per_second",
                  (Line("generation_tokens_per_second", "out"),)),
        Indicator("running", "Running sequences", "requests", (Line("requests_running", "running"),)),
        Indicator("kv", "KV cache usage per worker", "ratio", (Line("kv_cache_usage_ratio", ""),), per_worker=True),
        Indicator("spec", "Speculative draft tokens per second", "tokens_per_second",
                  (Line("spec_proposed_tokens_per_second", "proposed", "dot"),
                   Line("spec_accepted_tokens_per_second", "accepted")),
                  value_metric="spec_acceptance_ratio", empty=SPEC_ABSENT),
        memory,
        Indicator("decode_roofline", "Decode roofline per worker (weights read per step ÷ the host's bandwidth)",
                  "ratio", (Line("decode_roofline_ratio", ""),), per_worker=True, empty=ROOFLINE_ABSENT),
    )


GPU_HEALTH = (
    Indicator("gpu_temp", "GPU temperature per worker", "celsius", (Line("gpu_temperature_celsius", ""),),
              per_worker=True),
    Indicator("gpu_frag", "GPU memory fragmentation per worker (reserved − allocated)", "bytes",
              (Line("gpu_memory_fragmentation_bytes", ""),), per_worker=True),
)


def stage_columns(deployment) -> list[dict]:
    """[{"role", "title", "stages": ("prefill",) ...}]: two columns for a disaggregated deployment, one otherwise."""
    if deployment.mode == DeploymentMode.DISAGGREGATED:
        return [{"role": "prefill", "title": "Prefill", "stages": ("prefill",)},
                {"role": "decode", "title": "Decode", "stages": ("decode",)}]
    return [{"role": "colocated", "title": "Prefill and decode (colocated pool)", "stages": ("prefill", "decode")}]


def worker_threads(deployment) -> int:
    """The threads each worker computes with (the revision's `threads`, else 1, as the node agent starts them)."""
    revision = deployment.current_revision
    threads = (revision.engine_settings or {}).get("threads") if revision is not None else None
    return int(threads) if isinstance(threads, int) and threads > 0 else 1


def objectives_of(deployment) -> dict[str, float]:
    return objectives_merge(deployment.objectives, {})


def _value_of(indicator: Indicator) -> tuple[str, str]:
    metric = indicator.value_metric or indicator.lines[-1].metric
    # dash.metric_value reads the unit from a name's suffix: cores per thread are a ratio.
    unit = "cpu_per_thread_ratio" if indicator.per_thread else ""
    return metric, unit


def stage_values(deployment, *, has_gpu: bool, now: float | None = None) -> list[dict]:
    """Each column with its current values: [{"role", "title", "stages", "values": [{"key", "label", "metric",
    "value", "text"}], "error"}], the pool aggregate's newest value in the past minute (value None, text "–": no
    data; text "unavailable" and the column's "error" set: the backend did not answer), all read in one query."""
    now = as_unix(now)
    threads = worker_threads(deployment)
    columns = [{**column, "indicators": [indicator for stage in column["stages"]
                                         for indicator in stage_indicators(stage, has_gpu=has_gpu)]}
               for column in stage_columns(deployment)]
    error = None
    try:
        latest = reader().latest_pool_values(
            deployment_ids=[deployment.pk], now=now, window_s=VALUE_WINDOW_S,
            metrics={_value_of(i)[0] for column in columns for i in column["indicators"]},
            roles={column["role"] for column in columns})
    except MetricsUnavailable as exc:
        latest, error = {}, str(exc)
    for column in columns:
        values = []
        column["error"] = error
        for indicator in column.pop("indicators"):
            metric, unit = _value_of(indicator)
            value = latest.get((deployment.pk, column["role"], metric))
            if value is not None and indicator.per_thread:
                value /= threads
            text = UNAVAILABLE if error else metric_value(value, unit or metric)
            if value is not None and indicator.objective:
                text += f" (objective {metric_value(objectives_of(deployment)[indicator.objective], metric)})"
            values.append({"key": indicator.key, "label": indicator.title, "metric": metric, "value": value,
                           "text": text})
        column["values"] = values
    return columns


def _queries(indicator: Indicator, *, deployment, role, workers, start, end, step) -> list[SeriesQuery]:
    return [SeriesQuery(metric=line.metric, deployment_id=deployment.pk, role=role,
                        worker=workers if indicator.per_worker else None, start=start, end=end, step=step)
            for line in indicator.lines]


def _series(indicator: Indicator, found: list[tuple[str, list[dict]]], *, threads: int) -> list[Series]:
    """The chart's series from query_series_many's answers to _queries(indicator)."""
    series: list[Series] = []
    for line, (_, items) in zip(indicator.lines, found):
        for item in items:
            who = item["role"] if item["worker_id"] is None else f'{item["role"]} #{item["worker_id"]}'
            points = item["points"]
            if indicator.per_thread:
                points = [[ts, value / threads] for ts, value in points]
            series.append(Series(f"{line.label} {who}".strip(), points, line.dash,
                                 group=f'{item["role"]}#{item["worker_id"] or ""}', top=histogram_top(line.metric)))
    return series


def stage_charts(deployment, *, range_key: str, now: float) -> dict:
    """{"columns": [{"role", "title", "order": [chart keys], "values": [...]}], "figures": {key: figure},
    "health_order": [keys], "has_gpu", "error"}. Chart keys are "stage-<role>-<indicator>" and
    "health-<indicator>"; "error": why the series could not be read (each chart then shows it), else None.

    1. Read every chart's series. 2. Say why an empty chart is empty (panels.empty_reason, unless the indicator has
    its own reason). 3. Draw, with each latency chart's objective."""
    start = range_start(deployment, seconds=RANGES[range_key], now=now)
    step = auto_step(start, now)
    has_gpu = deployment_has_gpu(deployment)
    threads = worker_threads(deployment)
    objectives = objectives_of(deployment)
    since = datetime.fromtimestamp(start, tz=timezone.utc)
    workers = tuple(Worker.objects.filter(deployment=deployment).exclude(stopped_at__lt=since)
                    .values_list("id", flat=True))
    read = dict(deployment=deployment, workers=workers, start=start, end=now, step=step)
    # Every chart's queries first, then one query_range: the lines of one scope are read together.
    wanted: list[tuple[str, Indicator, list[SeriesQuery]]] = []
    columns = []
    current = stage_values(deployment, has_gpu=has_gpu, now=now)
    for column in current:
        order = []
        for stage in column["stages"]:
            for indicator in stage_indicators(stage, has_gpu=has_gpu):
                key = f"stage-{column['role']}-{indicator.key}"
                wanted.append((key, indicator, _queries(indicator, role=column["role"], **read)))
                order.append(key)
        columns.append({"role": column["role"], "title": column["title"], "order": order,
                        "values": [{k: v for k, v in value.items() if k != "value"} for value in column["values"]]})
    num_charts = len(wanted)
    if has_gpu:
        wanted += [(f"health-{indicator.key}", indicator, _queries(indicator, role=tuple(deployment.roles), **read))
                   for indicator in GPU_HEALTH]
    all_queries = [query for _, _, queries in wanted for query in queries]
    # The values' read failed a moment ago: the same backend is not asked (and waited for) again.
    error = next((column["error"] for column in current if column["error"]), None)
    found = iter([("", [])] * len(all_queries))
    if error is None:
        try:
            found = iter(reader().query_range(all_queries, now=now))
        except MetricsUnavailable as exc:
            error = str(exc)
    loaded = [(key, indicator, _series(indicator, [next(found) for _ in queries], threads=threads))
              for key, indicator, queries in wanted]
    charts = loaded[:num_charts]
    health = loaded[num_charts:] if has_gpu else [(f"health-{indicator.key}", indicator, [])
                                                  for indicator in GPU_HEALTH]
    num_live = Worker.objects.filter(deployment=deployment, status__in=LIVE_STATUSES).count()
    reason = empty_reason(num_live_workers=num_live,
                          has_samples=any(s.points for _, _, series in charts + health for s in series))
    figures: dict[str, dict] = {}
    for key, indicator, series in charts:
        title = indicator.title
        if error:
            figures[key] = error_figure(title, error, x_range=(start, now))
            continue
        if series and indicator.objective:
            objective = objectives[indicator.objective]
            peak = max((p[1] for item in series for p in item.points), default=0.0)
            if peak >= OBJECTIVE_DRAWN_ABOVE * objective:
                series = series + [Series("objective P99", [[start, objective], [now, objective]], "dash",
                                          group="objective")]
            else:
                title = f"{title} · objective {objective:g} s, far above"
        figures[key] = line_figure(title, series, Axis(indicator.unit), x_range=(start, now),
                                   empty_reason=indicator.empty or reason)
    for key, indicator, series in health:
        if not has_gpu:
            figures[key] = empty_figure(indicator.title, NO_GPU, x_range=(start, now))
        elif error:
            figures[key] = error_figure(indicator.title, error, x_range=(start, now))
        else:
            figures[key] = line_figure(indicator.title, series, Axis(indicator.unit), x_range=(start, now),
                                       empty_reason=reason)
    windows = chaos_windows(deployment, start=start, end=now)
    for figure in figures.values():
        shade_windows(figure, windows)
    return {"columns": columns, "figures": figures, "health_order": [key for key, _, _ in health],
            "has_gpu": has_gpu, "chaos_windows": windows, "error": error}
