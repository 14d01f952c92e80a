"""Keeping the router's view of its workers true: each listed worker's /health probed every --health-interval (and at
once when the membership names a new one), its answer read by health_answer.py, the worker put in or out of
rotation. Selection (routing.py) only reads what this module writes.
"""
from __future__ import annotations

import asyncio
import logging

import aiohttp

from inference.engines import TANDEM
from inference.gateway.health_answer import health_read
from inference.gateway.routing import Router, Worker, WorkerState

# A ready worker leaves rotation when this many health probes in a row get no answer within --health-timeout (with
# the defaults, 1 s each: after two probes' timeouts). A refused connection or an answer that is not ok takes it out
# at the first.
PROBE_TIMEOUTS_TO_DOWN = 2

log = logging.getLogger("tandem.gateway.routing")


async def probe(router: Router, session: aiohttp.ClientSession, worker: Worker) -> None:
    """Ready while /health answers ok for its role. An answer saying otherwise, or a connection that fails, takes the
    worker out at once; a probe that only ran out of time does so at the PROBE_TIMEOUTS_TO_DOWN-th in a row (a ready
    worker on a busy host answers late now and then, and one late answer is not a dead worker)."""
    health_timeout = router.config.health_timeout
    try:
        async with session.get(worker.url + "/health", timeout=aiohttp.ClientTimeout(total=health_timeout)) as resp:
            worker.probe_timeouts = 0  # it answered: whatever it says counts from here
            try:
                body = await resp.json(content_type=None) if worker.engine == TANDEM else {}
            except ValueError:
                body = {}
            reason = health_read(worker, resp.status, body)
            if reason is not None:
                router.mark_down(worker, reason)
                return
    except asyncio.TimeoutError:  # aiohttp's own timeouts are asyncio.TimeoutError too
        worker.probe_timeouts += 1
        if worker.state is WorkerState.READY and worker.probe_timeouts < PROBE_TIMEOUTS_TO_DOWN:
            log.info("%s %s: health probe got no answer within %.1f s (%d in a row); kept in rotation",
                     worker.role.value, worker.url, health_timeout, worker.probe_timeouts)
            return
        router.mark_down(worker, f"health probe got no answer within {health_timeout:g} s "
                                 f"({worker.probe_timeouts} in a row)")
        return
    except (aiohttp.ClientError, OSError) as exc:
        worker.probe_timeouts = 0
        router.mark_down(worker, f"health probe failed: {type(exc).__name__}: {exc}".rstrip(": "))
        return
    if worker.state is not WorkerState.READY:
        log.info("%s %s is ready", worker.role.value, worker.url)
    if worker.ejected.is_set():
        worker.ejected = asyncio.Event()
    worker.state = WorkerState.READY
    worker.reason = "ok"


async def probe_all(router: Router, session: aiohttp.ClientSession) -> None:
    await asyncio.gather(*(probe(router, session, w) for w in router.workers))


async def run_health_loop(router: Router, session: aiohttp.ClientSession) -> None:
    """Probe every worker each --health-interval, and at once when the membership lists a worker not seen before."""
    while True:
        router.probe_wakeup.clear()
        await probe_all(router, session)
        try:
            await asyncio.wait_for(router.probe_wakeup.wait(), router.config.health_interval)
        except asyncio.TimeoutError:
            pass
