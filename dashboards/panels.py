"""The deployment page's charts: which stored series each panel draws, read through the metrics backend's reader
(`observability.reader`: `query_range`, the same read as `GET /api/v1/metrics/query`), turned into figures by
`dashboards.charts`. A backend that does not answer draws every chart as its error (charts.error_figure).

Pool panels draw the pool aggregates of every role (the gateway's client-side view included: its latencies are
what users see); worker panels draw one line per worker. A host without GPUs gets CPU and memory panels instead of
GPU panels that would stay empty forever.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from django.conf import settings

from controlplane.models import Node, Worker
from controlplane.models.workers import LIVE_STATUSES
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import SeriesQuery, auto_step
from dashboards.buckets import histogram_top
from dashboards.chaos import chaos_windows
from dashboards.charts import Axis, Series, error_figure, line_figure, shade_windows

RANGES = {"15m": 15 * 60, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}
# A fresh `make run` has minutes of data: an hour-wide default would squeeze them into a corner.
DEFAULT_RANGE = "15m"
# A range starts when the deployment was created (nothing can come before), but is never narrower than this.
MIN_RANGE_S = 120


@dataclass(frozen=True, slots=True)
class Line:
    metric: str
    label: str  # "P99": the trace is named "<label> <role>" (pools) or "<label> <role> #<id>" (workers)
    dash: str = "solid"


@dataclass(frozen=True, slots=True)
class Panel:
    key: str
    title: str
    unit: str
    lines: tuple[Line, ...]
    per_worker: bool = False


LATENCY_PANELS = (
    Panel("ttft", "Time to first token", "seconds",
          (Line("ttft_p50_seconds", "P50", "dot"), Line("ttft_p99_seconds", "P99"))),
    Panel("itl", "Inter-token latency", "seconds",
          (Line("itl_p50_seconds", "P50", "dot"), Line("itl_p99_seconds", "P99"))),
    Panel("e2e", "End-to-end latency", "seconds",
          (Line("e2e_p50_seconds", "P50", "dot"), Line("e2e_p99_seconds", "P99"))),
)
TRAFFIC_PANELS = (
    Panel("qps", "Requests per second", "requests_per_second", (Line("qps", "QPS"),)),
    Panel("tokens", "Tokens per second", "tokens_per_second",
          (Line("prompt_tokens_per_second", "in"), Line("generation_tokens_per_second", "out", "dot"))),
    Panel("errors", "Error ratio", "ratio",
          (Line("error_ratio", "errors"), Line("server_error_ratio", "5xx", "dot"))),
    Panel("requests", "Running and waiting requests", "requests",
          (Line("requests_running", "running"), Line("requests_waiting", "waiting", "dot"))),
)
GPU_PANELS = (
    Panel("gpu_util", "GPU utilisation per worker", "ratio", (Line("gpu_utilization_ratio", ""),), per_worker=True),
    Panel("gpu_mem", "GPU memory per worker", "bytes", (Line("gpu_memory_used_bytes", ""),), per_worker=True),
)
CPU_PANELS = (
    Panel("cpu", "CPU per worker (no GPU on this host)", "cores", (Line("cpu_usage_ratio", ""),), per_worker=True),
    Panel("mem", "Resident memory per worker (no GPU on this host)", "bytes",
          (Line("resident_memory_bytes", ""),), per_worker=True),
)
KV_PANEL = Panel("kv", "KV cache usage per worker", "ratio", (Line("kv_cache_usage_ratio", ""),), per_worker=True)


def panels_for(*, has_gpu: bool) -> tuple[Panel, ...]:
    return LATENCY_PANELS + TRAFFIC_PANELS + (GPU_PANELS if has_gpu else CPU_PANELS) + (KV_PANEL,)


def deployment_has_gpu(deployment) -> bool:
    """Whether the nodes running this deployment (or, with nothing running, any node) have a GPU."""
    nodes = Node.objects.filter(workers__deployment=deployment, workers__status__in=LIVE_STATUSES).distinct()
    if not nodes.exists():
        nodes = Node.objects.all()
    return any(node.gpus for node in nodes.only("gpus"))


def parse_range(raw: str | None) -> str:
    return raw if raw in RANGES else DEFAULT_RANGE


def _series_name(line: Line, role: str, worker_id: int | None) -> str:
    who = role if worker_id is None else f"{role} #{worker_id}"
    return f"{line.label} {who}".strip()


def empty_reason(*, num_live_workers: int, has_samples: bool) -> str:
    """Why a chart has nothing to draw, in the words an operator needs."""
    if num_live_workers == 0:
        return "no workers: scale a pool up to start one"
    if not has_samples:
        return f"no samples yet: the scraper runs every {settings.TANDEM_SCRAPE_INTERVAL_S} s"
    return "no samples of this metric in this time range"


def range_start(deployment, *, seconds: float, now: float) -> float:
    """The start of a range of `seconds` ending now: never before the deployment was created, so that a young
    deployment's charts span its life, unless that is shorter than MIN_RANGE_S."""
    created = deployment.created_at.timestamp()
    return max(now - seconds, min(created, now - MIN_RANGE_S))


def chart_figures(deployment, *, range_key: str, now: float) -> dict:
    """{"range", "start", "end", "has_gpu", "figures": {panel key: figure}, "order", "chaos_windows", "error"};
    "error": why the series could not be read (each figure then says so), else None."""
    seconds = RANGES[range_key]
    start, end = range_start(deployment, seconds=seconds, now=now), now
    step = auto_step(start, end)
    has_gpu = deployment_has_gpu(deployment)
    panels = panels_for(has_gpu=has_gpu)
    num_live = Worker.objects.filter(deployment=deployment, status__in=LIVE_STATUSES).count()
    roles = tuple(deployment.roles) + ("gateway",)
    # Workers that may have samples in the range: samples outlive a stopped worker, so a replaced one still shows.
    since = datetime.fromtimestamp(start, tz=timezone.utc)
    workers = tuple(Worker.objects.filter(deployment=deployment).exclude(stopped_at__lt=since)
                    .values_list("id", flat=True))
    # Named roles and workers rather than "every worker": exact index prefixes, see SeriesQuery. All lines at once:
    # the pool lines are one read per source, the per-worker lines another.
    lines = [(panel, line) for panel in panels for line in panel.lines]
    error = None
    try:
        found = reader().query_range([SeriesQuery(metric=line.metric, deployment_id=deployment.pk, role=roles,
                                                  worker=workers if panel.per_worker else None, start=start,
                                                  end=end, step=step) for panel, line in lines], now=now)
    except MetricsUnavailable as exc:
        found, error = [("", [])] * len(lines), str(exc)
    loaded: dict[str, list[Series]] = {panel.key: [] for panel in panels}
    for (panel, line), (_, items) in zip(lines, found):
        loaded[panel.key].extend(Series(_series_name(line, item["role"], item["worker_id"]), item["points"],
                                        line.dash, group=f'{item["role"]}#{item["worker_id"] or ""}',
                                        top=histogram_top(line.metric))
                                 for item in items)
    has_samples = any(s.points for series in loaded.values() for s in series)
    reason = empty_reason(num_live_workers=num_live, has_samples=has_samples)
    windows = chaos_windows(deployment, start=start, end=end)
    figures = {panel.key: shade_windows(error_figure(panel.title, error, x_range=(start, end)) if error else
                                        line_figure(panel.title, loaded[panel.key], Axis(panel.unit),
                                                    x_range=(start, end), empty_reason=reason), windows)
               for panel in panels}
    return {"range": range_key, "start": start, "end": end, "step": step, "has_gpu": has_gpu,
            "figures": figures, "order": [panel.key for panel in panels], "chaos_windows": windows, "error": error}
