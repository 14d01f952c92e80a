"""Fetch many /metrics pages at once: one aiohttp session, a connection limit, a timeout per target. No Django.

A target that fails (refused, timeout, non-200, unparseable text) yields a Fetched with `error` set; the cycle
records it as up=0 and never raises for it.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from controlplane.observability.exposition import Reading, parse_exposition


@dataclass(frozen=True, slots=True)
class Target:
    worker_id: int
    deployment_id: int
    role: str
    url: str  # base URL; /metrics is appended


@dataclass(slots=True)
class Fetched:
    target: Target
    reading: Reading | None
    error: str
    seconds: float


async def _fetch_one(session: aiohttp.ClientSession, target: Target) -> Fetched:
    started = time.perf_counter()
    try:
        async with session.get(target.url.rstrip("/") + "/metrics") as response:
            text = await response.text()
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {text[:200]}")
        # Parsing here, between awaits, overlaps it with the other targets' network waits.
        reading = parse_exposition(text)
        return Fetched(target, reading, "", time.perf_counter() - started)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return Fetched(target, None, error, time.perf_counter() - started)


async def fetch_all(targets: list[Target], *, timeout_s: float, concurrency: int) -> list[Fetched]:
    """Scrape every target, at most `concurrency` connections open at once; results in the order of `targets`."""
    if not targets:
        return []
    # The semaphore, not only the connector limit, bounds concurrency: aiohttp's `total` timeout would otherwise
    # also count the time a request waits for a free connection, and queued targets would time out unscraped.
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    # `total` bounds one whole scrape (connect + headers + body), whatever a slow target does.
    client_timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def bounded(session, target):
        async with semaphore:
            return await _fetch_one(session, target)

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:
        return await asyncio.gather(*(bounded(session, target) for target in targets))


def scrape(targets: list[Target], *, timeout_s: float, concurrency: int) -> list[Fetched]:
    """Blocking wrapper for Celery tasks and benchmarks (each call runs its own event loop)."""
    return asyncio.run(fetch_all(targets, timeout_s=timeout_s, concurrency=concurrency))
