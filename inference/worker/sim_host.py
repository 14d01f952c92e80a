"""Many simulated workers in one process: `python -m inference.worker.sim_host --port P`.

A thousand worker processes would need a thousand Python interpreters (some 40 MiB each); a simulated worker needs
only its own port and an asyncio server, so one host process carries hundreds of them, each bound to its own
host:port and scraped over real HTTP. A node agent drives the host through a small control API, as it would spawn
and signal processes (controlplane.agent.simulated):

- `POST /workers {"id": MARKER, "argv": [worker flags], "secret": S}` starts a worker from the same flags as
  `python -m inference.worker --simulate PROFILE ...`, with the worker secret a process gets in its environment
  (optional; inference.worker_secret); answers {"id", "pid", "started_at", "port"} (pid: a virtual process id,
  unique in this host), 400 naming a bad flag, 409 for an id already running, 503 when the port cannot be bound.
- `DELETE /workers/{id}?drain_timeout=S` drains it as SIGTERM would and closes it; `?kill=1` closes it at once
  (a crash, for tests); answers 202.
- `POST /workers/{id}/pause {"seconds": S}` holds it as SIGSTOP holds a process: every request to it (health
  checks, streams, the KV push) waits unanswered and its engine makes no progress, until `DELETE
  /workers/{id}/pause` (as SIGCONT) or S seconds (a bound, so that a worker whose agent is gone is not held for
  ever); answers 200 {"paused": true}, 404 for an unknown id. A worker killed meanwhile (`?kill=1`) closes as it is.
- `GET /workers` lists the running ones (`paused` says which are held) and the exit codes of those that ended since
  (`exited`).

These are how the node agent carries out chaos faults on a simulated worker (controlplane.agent.faults): `kill` is
`?kill=1` (exit code -9, as the supervisor sees a SIGKILLed process), `pause` is the hold above; the proxy faults
need nothing here (a real fault proxy in front of the worker's real port).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import signal
import time

from aiohttp import web

from inference.engine.config import ConfigError
from inference.worker.config import build_parser, worker_config
from inference.worker.server import OPEN_PATHS, WorkerServer
from inference.worker.sim_profile import ProfileError

log = logging.getLogger(__name__)

PID_BASE = 1_000_000_000  # virtual pids: PID_BASE + host index * PID_SPAN + n, clear of real pids
PID_SPAN = 10_000_000


class HostedWorker(WorkerServer):
    """The worker server, with a hold in front of every request for the host's pause (a stopped process
    answers nothing, on any path), and its probes made cheap, since hundreds of workers share the host's one core:

    - /metrics is rendered only when a series may have changed since the last page, and served from memory
      otherwise. A series changes only while the worker works: a request of the worker protocol under way, a job
      open, or its engine not idle. So a page rendered while none of these held, with no such request begun or
      ended since, is still exact; an idle worker renders once, however often it is scraped.
    - /health's ready answer is built once: nothing in it changes while the worker is ready (a simulated engine
      fits no batch limit), and any other status is answered by the server's own handler.
    Nothing else differs: a simulated worker is the same server, and no timer or task of its own wakes while it idles.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unheld = asyncio.Event()
        self.unheld.set()
        self.release_timer: asyncio.TimerHandle | None = None
        self.num_requests_seen = 0  # worker-protocol requests begun or ended: each may change a series
        self.num_requests_open = 0
        self._page: tuple[int, bytes, str] | None = None  # (num_requests_seen when rendered, body, content type)
        self._ready_health: tuple[bytes, str] | None = None

    @property
    def paused(self) -> bool:
        return not self.unheld.is_set()

    @property
    def quiet(self) -> bool:
        """No series of this worker changes until a request comes."""
        return bool(self.info) and not self.num_requests_open and not self.jobs and self.engine.idle

    def pause(self, seconds: float) -> None:
        if self.release_timer is not None:
            self.release_timer.cancel()
        self.release_timer = asyncio.get_running_loop().call_later(seconds, self.resume)
        self.unheld.clear()
        self.engine.hold()

    def resume(self) -> None:
        if self.release_timer is not None:
            self.release_timer.cancel()
            self.release_timer = None
        self.unheld.set()
        self.engine.release()

    def build_app(self) -> web.Application:
        app = super().build_app()
        app.middlewares.insert(0, self._hold_middleware)
        return app

    @web.middleware
    async def _hold_middleware(self, request: web.Request, handler):
        await self.unheld.wait()
        if request.path in OPEN_PATHS:
            return await handler(request)
        self.num_requests_seen += 1
        self.num_requests_open += 1
        try:
            return await handler(request)
        finally:
            self.num_requests_open -= 1
            self.num_requests_seen += 1

    async def metrics_view(self, request: web.Request) -> web.Response:
        seen, quiet = self.num_requests_seen, self.quiet
        if quiet and self._page is not None and self._page[0] == seen:
            return web.Response(body=self._page[1], headers={"Content-Type": self._page[2]})
        response = await super().metrics_view(request)
        # The render runs off the event loop: the page is kept only if the worker stayed quiet throughout.
        if quiet and self.quiet and self.num_requests_seen == seen:
            self._page = (seen, response.body, response.headers["Content-Type"])
        return response

    async def health(self, request: web.Request) -> web.Response:
        if self._ready_health is not None and self.health_status()[0] == "ok":
            return web.Response(body=self._ready_health[0], headers={"Content-Type": self._ready_health[1]})
        response = await super().health(request)
        if response.status == 200:
            self._ready_health = (response.body, response.headers["Content-Type"])
        return response


class SimHost:
    def __init__(self, index: int):
        self.index = index
        self.workers: dict[str, tuple[int, float, HostedWorker]] = {}  # id -> (pid, started_at, worker)
        self.exited: dict[int, int] = {}  # virtual pid -> exit code, until listed once
        self._next = 0

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/workers", self.list_workers)
        app.router.add_post("/workers", self.start_worker)
        app.router.add_delete("/workers/{id}", self.stop_worker)
        app.router.add_post("/workers/{id}/pause", self.pause_worker)
        app.router.add_delete("/workers/{id}/pause", self.resume_worker)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "simulated": True, "index": self.index,
                                  "num_workers": len(self.workers)})

    async def list_workers(self, request: web.Request) -> web.Response:
        exited, self.exited = self.exited, {}
        return web.json_response({
            "workers": [{"id": wid, "pid": pid, "started_at": started, "port": w.config.port,
                         "role": w.config.engine.role,
                         "draining": w.draining, "paused": w.paused} for wid, (pid, started, w) in self.workers.items()],
            "exited": {str(pid): code for pid, code in exited.items()}})

    async def start_worker(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("body must be JSON: {id, argv}", 400)
        wid, argv = body.get("id") if isinstance(body, dict) else None, body.get("argv") if isinstance(body, dict) \
            else None
        secret = body.get("secret") if isinstance(body, dict) else None
        if not isinstance(wid, str) or not wid or not isinstance(argv, list) \
                or not all(isinstance(a, str) for a in argv):
            return _error("give id (a string) and argv (a list of strings)", 400)
        if secret is not None and (not isinstance(secret, str) or not secret):
            return _error("secret must be a non-empty string when given", 400)
        if wid in self.workers:
            return _error(f"worker {wid!r} is running here already", 409)
        parser = build_parser()
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = vars(parser.parse_args(argv))
            if not args["simulate"]:
                return _error("argv lacks --simulate PROFILE: this host runs simulated workers only", 400)
            config = worker_config({**args, "secret": secret})
        except SystemExit:
            return _error(f"bad worker flags: {stderr.getvalue().strip().splitlines()[-1:]}", 400)
        except ProfileError as exc:
            return _error(f"--simulate {exc}", 400)
        except ConfigError as exc:
            return _error(f"bad worker flags: --{exc.field.replace('_', '-')} {exc.requirement}", 400)
        worker = HostedWorker(config, process_metrics=False)
        try:
            await worker.start(shutdown_timeout=1.0)
        except OSError as exc:
            return _error(f"cannot listen on {config.host}:{config.port}: {exc}", 503)
        self._next += 1
        pid, started = PID_BASE + self.index * PID_SPAN + self._next, time.time()
        self.workers[wid] = (pid, started, worker)
        log.info("worker %s (%s, profile %s) on %s:%s as pid %d", wid, config.engine.role, config.engine.profile.name,
                 config.host, config.port, pid)
        return web.json_response({"id": wid, "pid": pid, "started_at": started, "port": config.port})

    async def stop_worker(self, request: web.Request) -> web.Response:
        wid = request.match_info["id"]
        entry = self.workers.get(wid)
        if entry is None:
            return _error(f"no worker {wid!r} here", 404)
        pid, _, worker = entry
        kill = request.query.get("kill") in ("1", "true")
        try:
            drain_timeout = float(request.query.get("drain_timeout", worker.config.drain_timeout))
        except ValueError:
            return _error("drain_timeout must be a number of seconds", 400)
        worker.config.drain_timeout = drain_timeout

        async def stop() -> None:
            await (worker.close() if kill else worker.drain_and_close())
            if self.workers.get(wid, (None,))[0] == pid:
                del self.workers[wid]
                self.exited[pid] = -9 if kill else 0
        if not worker.draining or kill:
            asyncio.get_running_loop().create_task(stop())
        return web.json_response({"id": wid, "stopping": True}, status=202)

    async def pause_worker(self, request: web.Request) -> web.Response:
        entry = self.workers.get(request.match_info["id"])
        if entry is None:
            return _error(f"no worker {request.match_info['id']!r} here", 404)
        try:
            body = await request.json()
            seconds = float(body["seconds"])
        except (ValueError, TypeError, KeyError):
            return _error("body must be JSON: {\"seconds\": S}, S > 0", 400)
        if not 0 < seconds < float("inf"):
            return _error(f"seconds must be a positive number, got {seconds}", 400)
        entry[2].pause(seconds)
        log.info("worker %s paused for at most %.1f s", request.match_info["id"], seconds)
        return web.json_response({"id": request.match_info["id"], "paused": True})

    async def resume_worker(self, request: web.Request) -> web.Response:
        entry = self.workers.get(request.match_info["id"])
        if entry is None:
            return _error(f"no worker {request.match_info['id']!r} here", 404)
        was_paused = entry[2].paused
        entry[2].resume()
        return web.json_response({"id": request.match_info["id"], "paused": False, "resumed": was_paused})


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def serve(host: str, port: int, index: int) -> int:
    sim_host = SimHost(index)
    runner = web.AppRunner(sim_host.build_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("simulated worker host %d listening on http://%s:%d", index, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await asyncio.gather(*(w.close() for _, _, w in sim_host.workers.values()), return_exceptions=True)
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.worker.sim_host",
                                description="Host many simulated workers in one process (see the module doc).")
    p.add_argument("--port", type=int, required=True, help="the control API's port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--index", type=int, default=0, help="this host's number among several (keeps pids unique)")
    args = p.parse_args(argv)
    if not 0 <= args.index < 100:
        p.error(f"--index must be in 0..99, got {args.index}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s simhost[%(process)d] %(levelname)s %(message)s")
    return asyncio.run(serve(args.host, args.port, args.index))


if __name__ == "__main__":
    raise SystemExit(main())
