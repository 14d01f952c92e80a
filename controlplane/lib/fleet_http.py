"""HTTP to the fleet's processes from the control plane's periodic passes: one event loop per process, in a thread of
its own, and one aiohttp session whose connections stay open across passes. No Django.

Scrape (/metrics) and health (/health) passes ask every worker something every few seconds. Each pass used to open
a new connection to every worker (a session per pass, or a thread pool of blocking requests): at a thousand workers
the TCP handshakes, and the threads, cost more than the answers. Here both kinds of pass share one pool of
keep-alive connections, one per worker address, reused pass after pass:

    from controlplane.lib.fleet_http import fleet_http
    results = fleet_http().run(lambda session: gather_something(session), timeout_s=30)

`run` may be called from any thread (the Celery threads pool runs several passes at once): the coroutine runs on the
loop's thread, the caller blocks for its result. A process that forked (a prefork pool) gets a fresh loop: threads
do not survive a fork. Idle connections close after KEEPALIVE_S, below the workers' own idle limit (aiohttp's
server: 75 s), so a pass rarely meets a connection the worker has just closed; when it does, the request is retried
once on a new connection (GET only, and only then).

A thousand open connections need a thousand file descriptors: the soft limit is raised to the hard limit when the
loop starts (a default soft limit of 1,024 would refuse the thousand-and-first).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Awaitable, Callable, Sequence, TypeVar

import aiohttp

log = logging.getLogger(__name__)

KEEPALIVE_S = 30.0
PASS_SLACK_S = 30.0  # a pass's bound beyond its requests' own timeouts (pass_bound_s)
T = TypeVar("T")
I = TypeVar("I")


def _raise_open_files_limit() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536),
                                                        hard))
    except (ImportError, ValueError, OSError) as exc:  # not POSIX, or not permitted: passes still work, up to soft
        log.info("open files limit left as it is: %s", exc)


class FleetHttp:
    """One loop thread and one session. Create through fleet_http() (one per process)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        _raise_open_files_limit()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fleet-http", daemon=True)
        self._thread.start()
        self._started.wait()
        self._session: aiohttp.ClientSession = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        self._loop.run_forever()

    async def _open(self) -> aiohttp.ClientSession:
        # No connector-wide limit: each pass bounds its own concurrency (a semaphore), and a limit here would make
        # a health pass queue behind a scrape pass's connections.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
        return aiohttp.ClientSession(connector=connector)

    def run(self, work: Callable[[aiohttp.ClientSession], Awaitable[T]], *, timeout_s: float) -> T:
        """Run work(session) on the loop; block the calling thread until it is done (at most timeout_s)."""
        future = asyncio.run_coroutine_threadsafe(work(self._session), self._loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()  # its requests stop too, rather than run on unseen
            raise

    def open_connections(self, ports: set[int] | None = None) -> int:
        """Idle keep-alive connections the session holds, still open, to any port or to these (tests, benches)."""
        conns = dict(getattr(self._session.connector, "_conns", {}))  # aiohttp's pool: {key: [(protocol, t)]}
        return sum(1 for key, held in conns.items() if ports is None or key.port in ports
                   for protocol, _ in list(held) if protocol.is_connected())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


_instance: FleetHttp | None = None
_instance_lock = threading.Lock()


def fleet_http() -> FleetHttp:
    """This process's FleetHttp, created on first use (and again in a forked child)."""
    global _instance
    with _instance_lock:
        if _instance is None or _instance.pid != os.getpid():
            _instance = FleetHttp()
        return _instance


async def get_text(session: aiohttp.ClientSession, url: str, *, timeout_s: float,
                   headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET url: (status, body text). A reused connection the peer had just closed is retried once on a new one.

    The timeout bounds connecting and each wait for data (as `requests`' timeout does), not the whole exchange: on a
    loaded host the loop thread may wake seconds late, and a `total` timer that expired meanwhile would fire before
    the answer that had long arrived was read, reading a healthy worker as down. Read timeouts are reset by the
    arrival of data itself, so only a worker that sent nothing for timeout_s times out."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    for attempt in (0, 1):
        try:
            async with session.get(url, timeout=timeout, headers=headers) as response:
                return response.status, await response.text()
        except aiohttp.ClientConnectorError:
            raise  # no connection could be made at all (refused, unreachable): nothing to retry
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if attempt:
                raise
    raise AssertionError("unreachable")


def pass_bound_s(num_items: int, concurrency: int, timeout_s: float) -> float:
    """How long a whole pass may take: each batch of `concurrency` requests takes at most one timeout to connect and
    one per wait for data (and a retry), plus PASS_SLACK_S. Only a worker that drips its answer, a byte at a time,
    keeps a request alive past its own timeouts; the bound keeps such a worker from holding up the pass."""
    return 2 * timeout_s * -(-num_items // concurrency) + PASS_SLACK_S


async def gather_bounded(items: Sequence[I], one: Callable[[I], Awaitable[T]], *, concurrency: int,
                         bound_s: float, late: Callable[[I], T]) -> list[T]:
    """one(item) for every item, at most `concurrency` at once; results in the order of `items`. An item not done
    within bound_s is cancelled and yields late(item): the pass records it as failed and keeps every other answer,
    rather than losing them all to one slow peer."""
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded(item):
        async with semaphore:
            return await one(item)

    tasks = [asyncio.ensure_future(bounded(item)) for item in items]
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=bound_s)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)  # let the cancelled requests give their connections back
        log.warning("%d of %d requests not done within the pass's bound of %.0f s", len(pending), len(tasks), bound_s)
    return [late(item) if task in pending else task.result() for item, task in zip(items, tasks)]
