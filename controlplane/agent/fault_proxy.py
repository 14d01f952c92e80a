"""The fault proxy: an HTTP reverse proxy that the node agent puts in front of one worker for a chaos fault
(controlplane.agent.proxy_faults), so that the worker's answers fail or crawl without a test hook in the worker.

    python -m controlplane.agent.fault_proxy --upstream http://127.0.0.1:8001 --port 8101 --until 1767225600 \
        [--error-ratio 0.5] [--latency-ms 200] [--line-latency-ms 50] [--reset-ratio 0.1] \
        [--partition [--partition-after-s 5]] [--corrupt-ratio 1 --corrupt-bytes 4]

While the gateway's membership names the proxy instead of the worker (the agent swaps the Worker row's port), every
request goes through it. The faults touch only generation requests (paths under `/v1/`: generate, prefill, the KV
push, a decode stream); `/health`, `/info` and `/metrics` pass through untouched, as a real engine that fails or
crawls still answers its health check (a bad canary's workers are ready and fail requests: that is what the
rollout's analysis, not supervision, must catch):

- `--error-ratio R`: that fraction of generation requests is answered `500 {"error": {"code": "fault_injected"}}`
  at once, without reaching the worker (fault `error`);
- `--latency-ms MS`: each generation request waits that long before it is forwarded; `--line-latency-ms MS`: each
  line of a streamed answer (an NDJSON token event) waits that long before it is passed on (fault `latency`);
- `--reset-ratio R`: that fraction of generation requests has its connection cut (closed without an answer) before
  it reaches the worker, as a dropped connection does (fault `reset`);
- `--partition`: from `--partition-after-s` seconds after it listens (default 0), every request on every path
  (`/health` too: a partition spares nothing) is accepted and never answered, and an answer being streamed through
  the proxy stops passing, until the faults stop; then each held connection is closed without an answer: a network
  partition, as a client sees one (timeouts and stalls, not refusals) (fault `partition`). The delay lets gateways
  route requests and streams through the proxy first, so that the partition cuts some in flight;
- `--corrupt-ratio R`: that fraction of generation requests with a body has `--corrupt-bytes N` bytes of it, at
  random places, XOR-ed with a random non-zero byte on the way (fault `kv_corrupt`: bytes flipped in flight).

The KV faults (`kv_latency`, `kv_reset`, `kv_corrupt`) use the same flags on a proxy that only prefill workers'
KV pushes reach (the decode worker's KV address, controlplane.agent.proxy_faults).

Everything else is passed through as it comes, both ways: request bodies in chunks (a KV push), answers line by line
or chunk by chunk, so that a stream stays a stream; a client that goes away closes the upstream request too.

The proxy enforces its own deadline: at `--until` (Unix seconds) the faults stop, whether or not anyone tells it,
and it goes on as a plain pass-through, so that a worker whose agent or control plane is gone is neither failing nor
unreachable. SIGTERM (the agent's revert, once the Worker row names the worker again) stops the faults at once, goes
on forwarding for `--drain-s` (gateways that have not polled the membership since still send here) and until no
request is open (at most 60 s more), then exits 0. Pure asyncio + aiohttp: no Django.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import sys
import time

import aiohttp
from aiohttp import web

log = logging.getLogger("fault_proxy")

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp sets itself: never copied across.
HOP_HEADERS = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host"))
FAULTED_PREFIX = "/v1/"
MAX_DRAIN_WAIT_S = 60.0
CHUNK_BYTES = 1 << 16


class FaultProxy:
    def __init__(self, *, upstream: str, until: float, error_ratio: float = 0.0, latency_ms: float = 0.0,
                 line_latency_ms: float = 0.0, reset_ratio: float = 0.0, partition_at: float | None = None,
                 corrupt_ratio: float = 0.0, corrupt_bytes: int = 1, rng: random.Random | None = None):
        self.upstream = upstream.rstrip("/")
        self.until = until
        self.error_ratio = error_ratio
        self.latency_s = latency_ms / 1000
        self.line_latency_s = line_latency_ms / 1000
        self.reset_ratio = reset_ratio
        self.partition_at = partition_at  # None: no partition
        self.corrupt_ratio = corrupt_ratio
        self.corrupt_bytes = corrupt_bytes
        self.reverted = False
        self.open_requests = 0
        self.injected = {"error": 0, "latency": 0, "reset": 0, "partition": 0, "corrupt": 0}
        self.rng = rng or random.Random()
        self.session: aiohttp.ClientSession | None = None

    def active(self) -> bool:
        """Whether the faults apply now: not reverted, and the deadline has not passed."""
        return not self.reverted and time.time() < self.until

    def partitioned(self) -> bool:
        return self.partition_at is not None and self.active() and time.time() >= self.partition_at

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app) -> None:
        # No connection limit (aiohttp's default is 100): the gateway's concurrency is the worker's to bound.
        self.session = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))

    async def _close(self, _app) -> None:
        await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.open_requests += 1
        try:
            if self.partitioned():
                return await self._hold(request)
            faulted = request.path.startswith(FAULTED_PREFIX) and self.active()
            if faulted and self.reset_ratio and self.rng.random() < self.reset_ratio:
                self.injected["reset"] += 1
                if request.transport is not None:
                    request.transport.close()  # no answer at all: the client sees the connection dropped
                return web.Response(status=502)  # never sent
            if faulted and self.error_ratio and self.rng.random() < self.error_ratio:
                self.injected["error"] += 1
                return web.json_response(status=500, data={"error": {
                    "message": f"fault injected by the chaos fault proxy (error, ratio {self.error_ratio:g}): this "
                               "worker's answers fail", "type": "server_error", "code": "fault_injected"}})
            if faulted and (self.latency_s or self.line_latency_s):
                self.injected["latency"] += 1
                await asyncio.sleep(self.latency_s)
            body = None
            if faulted and self.corrupt_ratio and request.body_exists and self.rng.random() < self.corrupt_ratio:
                body = self._corrupt(await request.read())
            return await self._forward(request, line_delay=faulted and self.line_latency_s > 0, body=body)
        finally:
            self.open_requests -= 1

    async def _hold(self, request: web.Request,
                    response: web.StreamResponse | None = None) -> web.StreamResponse:
        """Pass nothing more on while the partition lasts, then drop the client's connection (`response`: the one
        being streamed when it fell)."""
        self.injected["partition"] += 1
        while self.partitioned():
            await asyncio.sleep(min(0.1, max(0.0, self.until - time.time())))
        if request.transport is not None:
            request.transport.close()
        return response or web.Response(status=504)  # never sent

    def _corrupt(self, body: bytes) -> bytes:
        """`corrupt_bytes` bytes of `body` at random places, each XOR-ed with a random non-zero byte."""
        if not body:
            return body
        self.injected["corrupt"] += 1
        data = bytearray(body)
        for _ in range(self.corrupt_bytes):
            data[self.rng.randrange(len(data))] ^= self.rng.randrange(1, 256)
        return bytes(data)

    async def _forward(self, request: web.Request, *, line_delay: bool,
                       body: bytes | None = None) -> web.StreamResponse:
        """Pass the request on (`body`: instead of the request's own, already read) and stream the answer back."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if body is None and request.body_exists:
            body = request.content.iter_chunked(CHUNK_BYTES)
        try:
            upstream = await self.session.request(request.method, self.upstream + request.rel_url.raw_path_qs,
                                                  headers=headers, data=body, allow_redirects=False)
        except aiohttp.ClientError as exc:
            return web.json_response(status=502, data={"error": {
                "message": f"the fault proxy could not reach {self.upstream}: {exc!r}", "type": "server_error",
                "code": "upstream_unreachable"}})
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            pending = b""
            async for chunk in upstream.content.iter_chunked(CHUNK_BYTES):
                if self.partitioned():
                    return await self._hold(request, response)
                if not line_delay:
                    await response.write(chunk)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if self.active():
                        await asyncio.sleep(self.line_latency_s)
                    await response.write(line + b"\n")
            if pending:
                await response.write(pending)
            await response.write_eof()
        return response

    async def drain(self, drain_s: float) -> None:
        """After a revert: forward a while longer (gateways that still have the old membership), then until no request
        is open (bounded)."""
        await asyncio.sleep(drain_s)
        deadline = time.monotonic() + MAX_DRAIN_WAIT_S
        while self.open_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def _bounded(convert, low: float, high: float, what: str):
    """An argparse type: `convert(text)` within [low, high], else an error naming `what`."""
    def parse(text: str):
        value = convert(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not {what} in {low:g}..{high:g}")
        return value
    return parse


_ratio = _bounded(float, 0, 1, "a ratio")
_ms = _bounded(float, 0, 600_000, "milliseconds")
_seconds = _bounded(float, 0, 3600, "seconds")
_corrupt_count = _bounded(int, 1, 1024, "a byte count")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controlplane.agent.fault_proxy", description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="the worker's base URL, e.g. http://127.0.0.1:8001")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--until", type=float, required=True, help="Unix seconds: the faults stop then, told or not")
    p.add_argument("--error-ratio", type=_ratio, default=0.0, help="fraction of generation requests answered 500")
    p.add_argument("--latency-ms", type=_ms, default=0.0, help="added before each generation request")
    p.add_argument("--line-latency-ms", type=_ms, default=0.0, help="added before each line of a streamed answer")
    p.add_argument("--reset-ratio", type=_ratio, default=0.0,
                   help="fraction of generation requests whose connection is cut without an answer")
    p.add_argument("--partition", action="store_true",
                   help="every request, /health too, is held unanswered until the faults stop, then dropped")
    p.add_argument("--partition-after-s", type=_seconds, default=0.0,
                   help="the partition begins this long after the proxy listens (default: at once)")
    p.add_argument("--corrupt-ratio", type=_ratio, default=0.0,
                   help="fraction of generation requests whose body has bytes flipped on the way")
    p.add_argument("--corrupt-bytes", type=_corrupt_count, default=1, help="bytes flipped in a corrupted body")
    p.add_argument("--drain-s", type=float, default=3.0, help="forwarding goes on this long after SIGTERM")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    proxy = FaultProxy(upstream=args.upstream, until=args.until, error_ratio=args.error_ratio,
                       latency_ms=args.latency_ms, line_latency_ms=args.line_latency_ms, reset_ratio=args.reset_ratio,
                       corrupt_ratio=args.corrupt_ratio, corrupt_bytes=args.corrupt_bytes)
    runner = web.AppRunner(proxy.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    if args.partition:
        proxy.partition_at = time.time() + args.partition_after_s
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    print(json.dumps({"event": "listening", "port": args.port, "upstream": proxy.upstream, "until": args.until,
                      "error_ratio": args.error_ratio, "latency_ms": args.latency_ms,
                      "line_latency_ms": args.line_latency_ms, "reset_ratio": args.reset_ratio,
                      "partition_at": proxy.partition_at, "corrupt_ratio": args.corrupt_ratio,
                      "corrupt_bytes": args.corrupt_bytes}), flush=True)
    remaining = args.until - time.time()
    try:
        await asyncio.wait_for(stopped.wait(), timeout=max(0.0, remaining))
        print(json.dumps({"event": "reverted", "injected": proxy.injected}), flush=True)
    except asyncio.TimeoutError:
        print(json.dumps({"event": "deadline", "injected": proxy.injected}), flush=True)
        await stopped.wait()  # past the deadline: a plain pass-through until the agent's revert stops it
    proxy.reverted = True
    await proxy.drain(args.drain_s)
    await runner.cleanup()
    print(json.dumps({"event": "exit", "injected": proxy.injected}), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
