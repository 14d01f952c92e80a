"""Fetch many /metrics pages at once: the process's fleet session (controlplane.lib.fleet_http: connections kept open
across passes), a bound on concurrent requests, a timeout per target. No Django.

A shared gateway is one target per deployment it serves, each with the deployment's model: its page is fetched once
per pass and each target reads its model's part of it (exposition.model_page).

A target that fails (refused, timeout, non-200, unparseable text, or still answering when the pass's bound is up)
yields a Fetched with `error` set; the cycle records it as up=0 and never raises for it.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from controlplane.lib.fleet_http import PASS_SLACK_S, fleet_http, gather_bounded, get_text, pass_bound_s
from controlplane.lib.worker_keys import scrape_headers
from controlplane.observability.exposition import Reading, model_page, parse_exposition
from inference.engines.vllm import metrics as vllm_metrics


@dataclass(frozen=True, slots=True)
class Target:
    worker_id: int
    deployment_id: int
    role: str
    url: str  # base URL; /metrics is appended
    # A shared gateway's target: the model whose series are this deployment's; "" reads the whole page.
    model: str = ""


@dataclass(slots=True)
class Fetched:
    target: Target
    reading: Reading | None
    error: str
    seconds: float
    text: str = ""  # the page as fetched, until parse_all reads it


async def _fetch_one(session: aiohttp.ClientSession, target: Target, timeout_s: float) -> Fetched:
    started = time.perf_counter()
    try:
        # A gateway's page names its tenants: it answers only the scrape token (inference/gateway/operator_views.py).
        headers = scrape_headers() if target.role == "gateway" else None
        status, text = await get_text(session, target.url.rstrip("/") + "/metrics", timeout_s=timeout_s,
                                      headers=headers)
        if status != 200:
            raise ValueError(f"HTTP {status}: {text[:200]}")
        return Fetched(target, None, "", time.perf_counter() - started, text)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as exc:
        return Fetched(target, None, _error(exc), time.perf_counter() - started)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def fetch_all(session: aiohttp.ClientSession, targets: list[Target], *, timeout_s: float,
                    concurrency: int) -> list[Fetched]:
    """Fetch every target's page, at most `concurrency` requests at once; results in the order of `targets`. A target
    still answering when the pass's bound is up (fleet_http.pass_bound_s) is recorded as failed."""
    # Each request's timeouts (connect, each wait for data) start only once it holds a slot, so queued targets never
    # time out unscraped.
    # A shared gateway's targets share one URL: its page is fetched once, for all of them.
    pages = list({target.url: target for target in targets}.values())
    bound_s = pass_bound_s(len(pages), concurrency, timeout_s)
    fetched = await gather_bounded(
        pages, lambda target: _fetch_one(session, target, timeout_s), concurrency=concurrency, bound_s=bound_s,
        late=lambda target: Fetched(target, None, f"no complete answer within the pass's bound of {bound_s:.0f} s",
                                    bound_s))
    if len(pages) == len(targets):
        return fetched
    by_url = {item.target.url: item for item in fetched}
    return [Fetched(target, None, by_url[target.url].error, by_url[target.url].seconds, by_url[target.url].text)
            for target in targets]


def parse_all(fetched: list[Fetched]) -> list[Fetched]:
    """Parse the pages fetched (in the calling thread: the loop's thread only moves bytes, so that the health
    probes it carries at the same time are read as soon as they arrive); an unparseable page is a failed target."""
    for item in fetched:
        if item.text:
            try:
                # A vLLM worker's page in Tandem's names first (inference/engines/vllm/metrics.py).
                text = model_page(item.text, item.target.model) if item.target.model else item.text
                item.reading = parse_exposition(vllm_metrics.translate(text))
            except (ValueError, UnicodeDecodeError) as exc:
                item.error = _error(exc)
            item.text = ""
    return fetched


def scrape(targets: list[Target], *, timeout_s: float, concurrency: int) -> list[Fetched]:
    """Blocking, for Celery tasks and benchmarks: fetched on the process's fleet loop, over its kept-alive
    connections, then parsed here."""
    if not targets:
        return []
    bound_s = pass_bound_s(len(targets), concurrency, timeout_s)
    return parse_all(fleet_http().run(
        lambda session: fetch_all(session, targets, timeout_s=timeout_s, concurrency=concurrency),
        timeout_s=bound_s + PASS_SLACK_S))
