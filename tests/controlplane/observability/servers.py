"""Real HTTP peers for scrape tests: aiohttp servers on ephemeral ports, in one background event-loop thread,
each serving a prometheus_client exposition (a TandemMetrics registry, as a real worker renders it) or a failure,
and GET /health (200, as a ready worker answers). Each server records the client address of every request it
answers (`peers[port]`): one address per TCP connection, so a test sees whether connections were reused."""
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
        self.peers: dict[int, list[tuple]] = {}  # port -> client (host, port) of each request answered

    def _run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(self, render: Callable[..., tuple[int, bytes]], *, keepalive_timeout: float = 75.0,
              delay_s: float = 0.0, drip_s: float = 0.0, with_query: bool = False) -> int:
        """Start a server whose GET /metrics answers render() → (status, body), after delay_s; returns its port.
        with_query: render(query), the request's query parameters (a dict), as a shared gateway's page reads them.
        With drip_s, both /metrics and /health send their answer a byte every 50 ms, for drip_s at least (a peer
        that never stays silent long enough for a read timeout, yet never finishes)."""
        port_box: list[int] = []

        def seen(request) -> None:
            self.peers.setdefault(port_box[0], []).append(request.transport.get_extra_info("peername")[:2])

        async def drip(request, body: bytes):
            response = web.StreamResponse(status=200)
            await response.prepare(request)
            padded = body.ljust(int(drip_s / 0.05) + 1, b"\n")  # trailing newlines: still a valid page or JSON
            for i in range(len(padded)):
                await response.write(padded[i:i + 1])
                await asyncio.sleep(0.05)
            await response.write_eof()
            return response

        async def handler(request):
            seen(request)
            if delay_s:
                await asyncio.sleep(delay_s)
            status, body = render(dict(request.query)) if with_query else render()
            if drip_s:
                return await drip(request, body)
            return web.Response(status=status, body=body, content_type="text/plain")

        async def health(request):
            seen(request)
            if drip_s:
                return await drip(request, b'{"status": "ok"}')
            return web.json_response({"status": "ok"})

        async def start() -> int:
            app = web.Application()
            app.router.add_get("/metrics", handler)
            app.router.add_get("/health", health)
            runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_timeout)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            port_box.append(site._server.sockets[0].getsockname()[1])
            return port_box[0]

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
