"""The endpoints answer may give each group a `traffic_weight` (an integer 0..100) and a `variant` name
(docs/contracts.md). Absent, the gateway serves as before; a bad value makes the whole answer malformed, and the
last good membership stays.

The control plane here is a real HTTP server on a free port whose answer the test changes between polls."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from inference.gateway.config import Config
from inference.gateway.membership import ControlPlaneMembership, MembershipError, parse_endpoints
from inference.gateway.routing import Router
from tests.procs import free_port

A, B = "http://127.0.0.1:41001", "http://127.0.0.1:41002"


def _answer(first: dict | None = None, second: dict | None = None) -> dict:
    return {"deployment": "demo", "model": "demo", "mode": "colocated", "groups": [
        {"revision": 2, "prefill": [], "decode": [], "colocated": [A], **(first or {})},
        {"revision": 1, "prefill": [], "decode": [], "colocated": [B], **(second or {})}]}


def test_weights_and_variants_are_optional():
    _, groups = parse_endpoints(_answer())
    assert "traffic_weight" not in groups[0]
    _, groups = parse_endpoints(_answer({"traffic_weight": 10, "variant": "canary"},
                                        {"traffic_weight": 90, "variant": "stable"}))
    assert [(g["traffic_weight"], g["variant"]) for g in groups] == [(10, "canary"), (90, "stable")]
    _, groups = parse_endpoints(_answer({"traffic_weight": 0}, {"traffic_weight": 100, "variant": None}))
    assert groups[0]["traffic_weight"] == 0


@pytest.mark.parametrize("group,message", [
    ({"traffic_weight": 101}, "'traffic_weight' of revision 2 must be an integer in 0..100, not 101"),
    ({"traffic_weight": -1}, "must be an integer in 0..100, not -1"),
    ({"traffic_weight": 50.5}, "not 50.5"),
    ({"traffic_weight": "50"}, "not '50'"),
    ({"traffic_weight": True}, "not True"),
    ({"variant": ""}, "'variant' of revision 2 must be 1-32 printable ASCII characters without spaces, not ''"),
    ({"variant": "x" * 33}, "'variant' of revision 2 must be 1-32"),
    ({"variant": "can ary"}, "not 'can ary'"),
    ({"variant": "canary\r\nX-Evil: 1"}, "'variant' of revision 2"),
    ({"variant": "kanarienvögel"}, "'variant' of revision 2"),
    ({"variant": 3}, "not 3"),
])
def test_a_bad_weight_or_variant_rejects_the_answer(group, message):
    with pytest.raises(MembershipError) as raised:
        parse_endpoints(_answer(group))
    assert message in str(raised.value)


def test_the_split_reaches_the_router_and_a_bad_answer_keeps_the_last_good_one():
    answer = {"body": _answer({"traffic_weight": 20, "variant": "canary"}, {"traffic_weight": 80,
                                                                            "variant": "stable"})}

    async def endpoints(request: web.Request) -> web.Response:
        return web.json_response(answer["body"])

    def split(router: Router) -> dict:
        return {g.revision: (g.traffic_weight, g.variant) for g in router.groups}

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
                assert split(router) == {2: (20, "canary"), 1: (80, "stable")}
                assert router.groups[0].describe()["traffic_weight"] == 20

                answer["body"] = _answer({"traffic_weight": 200, "variant": "canary"})
                await membership.poll_once(session)
                assert "'traffic_weight' of revision 2 must be an integer in 0..100" in membership.last_error
                assert split(router) == {2: (20, "canary"), 1: (80, "stable")}  # the last good one

                answer["body"] = _answer()  # the rollout is over: no split
                await membership.poll_once(session)
                assert membership.last_error is None
                assert split(router) == {2: (None, None), 1: (None, None)}
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
