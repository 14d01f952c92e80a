"""Real HTTP peers for scrape tests: aiohttp servers on ephemeral ports, in one background event-loop thread,
each serving a prometheus_client exposition (a TandemMetrics registry, as a real worker renders it) or a failure."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from aiohttp import web


class MetricsServers:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def _run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(self, render: Callable[[], tuple[int, bytes]]) -> int:
        """Start a server whose GET /metrics answers render() → (status, body); returns its port."""

        async def handler(request):
            status, body = render()
            return web.Response(status=status, body=body, content_type="text/plain")

        async def start() -> int:
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            return site._server.sockets[0].getsockname()[1]

        return self._run(start())

    def serve_metrics(self, metrics) -> int:
        return self.serve(lambda: (200, metrics.render()))

    def close(self) -> None:
        async def stop():
            for runner in self.runners:
                await runner.cleanup()

        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
