"""A ready worker whose /health answers late once stays in rotation; two late answers in a row take it out. A refused
connection or an answer that is not ok takes it out at the first probe, as before.

The worker here is a real HTTP server on a free port whose /health the test makes slow, failing or gone between
probes; the router probes it as the gateway's health loop does."""
from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from inference.gateway.config import Config, Mode
from inference.gateway.health_probe import PROBE_TIMEOUTS_TO_DOWN, probe
from inference.gateway.routing import Router, WorkerState
from tests.procs import free_port

HEALTH_TIMEOUT_S = 1.0  # the default; an on-time answer here takes milliseconds, a late one 5 s


@contextlib.asynccontextmanager
async def _probed_by_a_router(health_view):
    """(router, its one colocated worker, the worker's runner) for a real HTTP server answering /health by
    `health_view`, with a client session open; the runner may be cleaned up early (the worker gone)."""
    app = web.Application()
    app.router.add_get("/health", health_view)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    await web.TCPSite(runner, "127.0.0.1", port).start()
    router = Router(Config(port=0, colocated_urls=[url], health_timeout=HEALTH_TIMEOUT_S))
    router.set_groups(Mode.COLOCATED, [{"revision": None, "colocated": [url]}])
    try:
        async with aiohttp.ClientSession() as session:
            yield router, session, router.workers[0], runner
    finally:
        await runner.cleanup()


def test_one_late_health_answer_keeps_a_ready_worker_and_two_in_a_row_take_it_out():
    assert PROBE_TIMEOUTS_TO_DOWN == 2
    health = {"delay_s": 0.0, "status": 200}

    async def answer(request):
        await asyncio.sleep(health["delay_s"])
        return web.json_response({"status": "ok" if health["status"] == 200 else "dead", "role": "colocated"},
                                 status=health["status"])

    async def scenario():
        async with _probed_by_a_router(answer) as (router, session, worker, runner):
            await probe(router, session, worker)
            assert worker.state is WorkerState.READY

            health["delay_s"] = 5.0
            await probe(router, session, worker)
            assert (worker.state, worker.probe_timeouts) == (WorkerState.READY, 1)
            health["delay_s"] = 0.0  # on time again: the count starts over
            await probe(router, session, worker)
            assert (worker.state, worker.probe_timeouts) == (WorkerState.READY, 0)

            health["delay_s"] = 5.0
            await probe(router, session, worker)
            assert worker.state is WorkerState.READY
            await probe(router, session, worker)
            assert worker.state is WorkerState.DOWN
            assert worker.reason == f"health probe got no answer within {HEALTH_TIMEOUT_S:g} s (2 in a row)"

            health["delay_s"] = 0.0
            await probe(router, session, worker)
            assert worker.state is WorkerState.READY and worker.reason == "ok"

            health["status"] = 503  # an answer that is not ok: out at once
            await probe(router, session, worker)
            assert worker.state is WorkerState.DOWN and "HTTP 503 dead" in worker.reason

            health["status"] = 200
            await probe(router, session, worker)
            assert worker.state is WorkerState.READY
            await runner.cleanup()  # the worker is gone: its port refuses
            await probe(router, session, worker)
            assert worker.state is WorkerState.DOWN and "health probe failed" in worker.reason

    asyncio.run(scenario())


def test_a_worker_not_ready_yet_is_not_given_the_benefit_of_the_doubt():
    async def slow(request):
        await asyncio.sleep(5.0)
        return web.json_response({"status": "ok", "role": "colocated"})

    async def scenario():
        async with _probed_by_a_router(slow) as (router, session, worker, _):
            await probe(router, session, worker)
            assert worker.state is WorkerState.DOWN  # never answered in time: not put in rotation

    asyncio.run(scenario())
