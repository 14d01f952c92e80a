"""A gateway's cumulative request counters at each of its scrapes, in either metrics backend: what a window as short
as a fault is read from (chaos: the hypothesis checks, the abort conditions and a run's report).

The stored series do not serve such a window: each is a rate or a quantile over the scrape window
(TANDEM_SCRAPE_WINDOW_S), longer than a fault, and Prometheus' increase() extrapolates the window's first and last
samples to its edges, so a count of requests is not a whole number. Both backends therefore give the counters as
scraped, and the caller reads a window as the increase between two scrapes (rollouts.analysis.window_numbers): exact
over the span between them, the same figures in both backends for the same scrapes.

    embedded    GatewayCounters rows, one per scrape that the gateway answered (written by store.py's cycle)
    prometheus  the raw samples of the gateway's request series (a range selector: no rate, no extrapolation),
                grouped by the timestamp of their scrape and folded by the embedded scrape's parser
                (exposition.parse_exposition), so that both count errors, client errors and buckets alike

An answer is [{"ts": Unix seconds of the scrape, "snapshot": {"c": {...}, "h": {...}}}], oldest first: the scrapes in
(start, end], led by the newest one at or before `start` (at most LOOKBACK_S earlier), which opens the window. A
snapshot is rollouts.analysis' format summed over revisions: "c" holds COUNTERS, "h" the latency histograms of
catalog.HISTOGRAMS as [[le, cumulative count], ...], with the +Inf bound as the string "+Inf" (JSON has none).

Two scrapes are the shortest window there is: a reader of a window shorter than the scrape interval widens it (the
chaos app says so in its report).
"""
from __future__ import annotations

import math
from collections import defaultdict

from controlplane.observability.catalog import HISTOGRAMS
from controlplane.observability.exposition import Reading, parse_exposition
from controlplane.observability.models import GatewayCounters

# Reading.counters keys kept per scrape: requests by outcome (errors split into the server's and the callers' by
# exposition.CLIENT_ERROR_KINDS), requests moved mid-stream, requests retried before their first token.
COUNTERS = ("success", "errors", "server_errors", "migrations", "retries")
# How far before a window's start its opening scrape may lie: a few missed scrapes, not a gateway silent for so
# long that its counters may have restarted unseen.
LOOKBACK_S = 120.0
# The gateway's series the snapshot is folded from, by their names in Prometheus.
SERIES = ("tandem_request_success_total", "tandem_request_errors_total", "tandem_request_migrations_total",
          "tandem_gateway_retries_total", *(f"{name}_bucket" for name in HISTOGRAMS.values()))
# Labels Prometheus adds to what it scrapes (Tandem's service discovery and its own): not the gateway's.
TARGET_LABELS = frozenset({"deployment", "pool", "node", "worker", "shared_gateway", "job", "instance"})


def counter_snapshot(reading: Reading) -> dict:
    """The snapshot of one scrape of a gateway (its request counters and latency histograms, all revisions)."""
    return {"c": {key: reading.counters.get(key, 0.0) for key in COUNTERS},
            "h": {key: [["+Inf" if math.isinf(le) else le, count] for le, count in reading.histograms[key]]
                  for key in HISTOGRAMS if key in reading.histograms}}


def in_window(scrapes: list[dict], *, start: float, end: float) -> list[dict]:
    """The scrapes (oldest first) in (start, end], led by the newest one in [start - LOOKBACK_S, start]."""
    opening = [scrape for scrape in scrapes if start - LOOKBACK_S <= scrape["ts"] <= start][-1:]
    return opening + [scrape for scrape in scrapes if start < scrape["ts"] <= end]


# --- embedded ---------------------------------------------------------------------------------------------------

def stored_counters(gateway_id: int, deployment_id: int, *, start: float, end: float) -> list[dict]:
    """The gateway's GatewayCounters rows of the window for one deployment (a shared gateway's process has a row per
    deployment at each scrape; the module docstring has the answer's shape)."""
    rows = GatewayCounters.objects.filter(worker_id=gateway_id, deployment_id=deployment_id)
    opening = (rows.filter(ts__gte=start - LOOKBACK_S, ts__lte=start).order_by("-ts")
               .values("ts", "snapshot").first())
    inside = list(rows.filter(ts__gt=start, ts__lte=end).order_by("ts").values("ts", "snapshot"))
    return ([opening] if opening else []) + inside


def counter_rows(ts: float, gateways: list[tuple[int, int, Reading]]) -> list[GatewayCounters]:
    """The rows of one scrape cycle: one per (gateway id, deployment id, reading) that answered (a shared gateway's
    reading is its deployment's part of the page, exposition.model_page)."""
    return [GatewayCounters(ts=ts, deployment_id=deployment_id, worker_id=worker_id,
                            snapshot=counter_snapshot(reading))
            for worker_id, deployment_id, reading in gateways]


# --- prometheus -------------------------------------------------------------------------------------------------

def range_selector(deployment: str, worker_id: int, *, start: float, end: float) -> str:
    """The gateway's raw request series from LOOKBACK_S before `start` to `end`, for an instant query at `end`."""
    span_ms = max(int(round((end - start + LOOKBACK_S) * 1000)), 1)
    return (f'{{__name__=~"{"|".join(SERIES)}", deployment="{deployment}", pool="gateway", '
            f'worker="{int(worker_id)}"}}[{span_ms}ms]')


def exposition_line(labels: dict[str, str], value: str) -> str:
    """One sample of a series Prometheus answered, as the gateway's page wrote it (without the target's labels)."""
    own = {key: text for key, text in labels.items() if key not in TARGET_LABELS}
    name = own.pop("__name__", "")
    return f"{name}{{{','.join(f'{key}={_quoted(text)}' for key, text in sorted(own.items()))}}} {value}"


def scraped_counters(matrix: list[dict], *, start: float, end: float) -> list[dict]:
    """A range selector's matrix (range_selector) as one snapshot per scrape of the window. The samples of one
    scrape share its timestamp; a failed scrape has none, as it has no GatewayCounters row."""
    pages: dict[float, list[str]] = defaultdict(list)
    for item in matrix:
        for at, value in item["values"]:
            pages[float(at)].append(exposition_line(item["metric"], value))
    scrapes = [{"ts": ts, "snapshot": counter_snapshot(parse_exposition("\n".join(lines) + "\n"))}
               for ts, lines in sorted(pages.items())]
    return in_window(scrapes, start=start, end=end)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
