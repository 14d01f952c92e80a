"""A request waiting on its prefill answer (which comes only once the KV push is on the decode worker) gives up at
once when the router takes its decode or prefill worker out of rotation, and is retried without it, rather than
waiting out the prefill worker's KV push timeout (30 s) behind a hung or partitioned worker.

The prefill worker here is a real HTTP server (in this event loop) that never answers, as one whose push is held."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from inference.gateway.config import Config, Mode
from inference.gateway.openai_protocol import ApiError
from inference.gateway.relay import Relay
from inference.gateway.routing import Router, WorkerState
from inference.roles import Role
from tests.procs import free_port

DECODE = "http://127.0.0.1:9"  # never reached: the gateway only names it to the prefill worker


@pytest.mark.parametrize("ejected_role", [Role.DECODE, Role.PREFILL])
def test_an_attempt_whose_worker_leaves_rotation_fails_over_at_once(ejected_role):
    async def scenario() -> tuple[float, ApiError, list[str]]:
        held, done = asyncio.Event(), asyncio.Event()

        async def prefill(request: web.Request) -> web.Response:
            held.set()
            await asyncio.wait_for(done.wait(), 60)  # a push the partition holds
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/v1/prefill", prefill)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        prefill_url = f"http://127.0.0.1:{port}"
        router = Router(Config(port=0, prefill_urls=[prefill_url], decode_urls=[DECODE]))
        router.set_groups(Mode.DISAGGREGATED, [{"revision": None, "prefill": [prefill_url], "decode": [DECODE]}])
        for worker in router.workers:
            worker.state = WorkerState.READY
        retries = []
        try:
            async with aiohttp.ClientSession() as session:
                relay = Relay(router.config, router, session, on_retry=retries.append)
                attempt = asyncio.create_task(relay.start(router.serving_group(), "r1",
                                                          {"prompt": "a", "max_tokens": 2}))
                await asyncio.wait_for(held.wait(), 10)
                began = time.monotonic()
                worker, = [w for w in router.workers if w.role is ejected_role]
                router.mark_down(worker, "health probe got no answer within 1 s (2 in a row)")
                with pytest.raises(ApiError) as failed:
                    await asyncio.wait_for(attempt, 10)
                return time.monotonic() - began, failed.value, retries
        finally:
            done.set()
            await runner.cleanup()

    seconds, error, retries = asyncio.run(scenario())
    assert seconds < 2, seconds  # not the push's 30 s
    # The retry finds no other worker of that role: the answer is the failure that made it retry.
    assert error.status == 502 and error.code == "worker_ejected", error.message
    assert "taken out of rotation before the first token" in error.message
    assert retries == ["worker_ejected"]
