"""The control plane's endpoints answer carries each worker's routing weight in a per-group `weights` map
(docs/contracts.md). An answer without it (an older control plane) weighs every worker 1; a bad weight makes the
whole answer rejected and the last good membership stays.

The control plane here is a real HTTP server on a free port whose answer the test changes between polls."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from inference.gateway.config import Config, Mode
from inference.gateway.membership import ControlPlaneMembership, MembershipError, parse_endpoints
from inference.gateway.routing import Router
from tests.procs import free_port

A, B = "http://127.0.0.1:41001", "http://127.0.0.1:41002"


def _answer(weights=None) -> dict:
    group = {"revision": 2, "prefill": [], "decode": [], "colocated": [A, B]}
    if weights is not None:
        group["weights"] = weights
    return {"deployment": "demo", "model": "demo", "mode": "colocated", "groups": [group]}


def test_an_answer_without_weights_is_accepted():
    mode, groups = parse_endpoints(_answer())
    assert mode is Mode.COLOCATED and "weights" not in groups[0]


@pytest.mark.parametrize("weights,message", [
    ({A: 0}, f"the weight of {A} in revision 2 must be above 0 and at most 100, not 0"),
    ({A: 101}, "must be above 0 and at most 100"),
    ({A: "3"}, "must be a number, not '3'"),
    ({A: True}, "must be a number, not True"),
    ({A: float("inf")}, "must be a number"),
    ([3, 1], "'weights' of revision 2 is not an object"),
])
def test_a_bad_weight_rejects_the_answer(weights, message):
    with pytest.raises(MembershipError) as raised:
        parse_endpoints(_answer(weights))
    assert message in str(raised.value)


def test_weights_from_the_control_plane_reach_the_router_and_a_bad_one_keeps_the_last_good_membership():
    answer = {"body": _answer({A: 3})}

    async def endpoints(request: web.Request) -> web.Response:
        return web.json_response(answer["body"])

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/api/v1/deployments/demo/endpoints", endpoints)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        config = Config(port=0, control_plane_url=f"http://127.0.0.1:{port}", deployment="demo", token="t")
        router = Router(config)
        membership = ControlPlaneMembership(config, router)
        try:
            async with aiohttp.ClientSession() as session:
                await membership.poll_once(session)
                assert {w.url: w.weight for w in router.workers} == {A: 3, B: 1}

                answer["body"] = _answer({A: 2, B: -1})
                await membership.poll_once(session)
                assert "the weight of http://127.0.0.1:41002 in revision 2" in membership.last_error
                assert {w.url: w.weight for w in router.workers} == {A: 3, B: 1}  # the last good one

                answer["body"] = _answer({B: 4})
                await membership.poll_once(session)
                assert membership.last_error is None
                assert {w.url: w.weight for w in router.workers} == {A: 1, B: 4}
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
