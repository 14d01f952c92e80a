"""The worker's one HTTP server: lifecycle, admission, the routes every role shares, and drain on SIGTERM.

It drives a WorkerEngine (seams.py): the model (model_engine.py), or with --simulate a profile (sim/engine.py);
what a client sees is this module's and the role modules' alone, so a real and a simulated worker cannot drift. A
server holds no per-process state (signal handlers are `serve`'s), so one process can run many (sim_host.py).

Order of life:
1. bind the port and answer at once (/health says 503 "starting" while the engine thread loads the model; a
   simulated engine is ready at once);
2. serve; /health is 200 only while the engine loop ticks;
3. on SIGTERM/SIGINT: refuse new requests (503, /health "draining"), let open ones finish for --drain-timeout,
   abort the rest, stop the engine thread, exit 0.
With a worker secret (inference.worker_secret) every route but /health, /metrics and /info answers only requests
that carry it: 401 without, 403 with a wrong one.
A model that fails to load makes the process exit 1 (a node agent sees a crash, not a zombie that answers 503).

The role's routes (`colocated`, `prefill`, `decode`) are handed this server as a `RoleHost` (seams.py): admitted
bodies, jobs, the model's facts; `jobs` gets only the engine's health and the metrics it needs.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import Callable

from aiohttp import web

from inference.engine.sequence import STANDARD_PRIORITY
from inference.metrics import CONTENT_TYPE, TandemMetrics
from inference.roles import Role
from inference.worker import colocated, decode, jobs, prefill
from inference.worker.config import WorkerConfig
from inference.worker.engine_request import EngineRequest, LoopState
from inference.worker.model_engine import ModelEngine
from inference.worker.protocol import GenerateRequest, RequestError, error_response, parse_generate, parse_json
from inference.worker.seams import KVCodec, WorkerEngine
from inference.worker.sim.engine import SimEngine
from inference.worker_secret import SECRET_ENV, SECRET_HEADER, secret_matches

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DRAIN_POLL_S = 0.05
# aiohttp's own cap on request bodies; each route enforces its tighter limit while reading (see read_body).
APP_MAX_BODY = 1 << 40
# Probes and scrapes: open to the control plane, the gateways and Prometheus without the worker secret.
OPEN_PATHS = frozenset({"/health", "/metrics", "/info"})
ROLE_ROUTES = {Role.COLOCATED: colocated.add_routes, Role.PREFILL: prefill.add_routes,
               Role.DECODE: decode.add_routes}


class WorkerServer:
    def __init__(self, config: WorkerConfig, *, process_metrics: bool = True):
        """`process_metrics`: export the process collector's series (off where many workers share a process)."""
        self.config = config
        self.metrics = TandemMetrics(role=config.engine.role, model=config.model_name, process=process_metrics,
                                     gpu=not config.simulated)
        self.engine: WorkerEngine = (SimEngine if config.simulated else ModelEngine)(config, self.metrics)
        # Said on /health whatever its status, so that nobody takes a simulated worker for a real one.
        self.markers = {"simulated": True, "profile": config.engine.profile.name} if config.simulated else {}
        self.jobs: dict[str, jobs.Job] = {}
        self.info: dict = {}
        self.draining = False
        self.exit_code: int | None = None
        self.exit_event = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._loader: asyncio.Task | None = None

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def kv(self) -> KVCodec:
        return self.engine.kv

    # -- life ------------------------------------------------------------------------------------------------------

    async def start(self, *, shutdown_timeout: float = 5.0) -> None:
        """Bind host:port and answer at once (OSError when the port is taken); load the engine meanwhile."""
        self._runner = web.AppRunner(self.build_app(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=shutdown_timeout)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.config.host, self.config.port).start()
        except OSError:
            await self._runner.cleanup()
            raise
        self.engine.start()
        self._loader = asyncio.get_running_loop().create_task(self._wait_loaded())

    async def close(self) -> None:
        """Stop at once: the port closes, open requests end, the engine stops."""
        if self._loader is not None:
            self._loader.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.engine.stop()

    async def drain_and_close(self) -> None:
        """As SIGTERM: drain for config.drain_timeout (see begin_drain), then close."""
        self.begin_drain()
        await self.exit_event.wait()
        await self.close()

    async def _wait_loaded(self) -> None:
        """Once the engine has loaded, publish what /info and handlers need; a failed load ends the process (1)."""
        info = await self.engine.wait_loaded()
        if info is None:
            self.exit_code = 1
            self.exit_event.set()
            return
        self.info = info
        log.info("ready: %s", info)

    def begin_drain(self) -> None:
        if self.draining or self.exit_event.is_set():
            return
        log.info("draining: %d requests in flight, up to %.0fs", len(self.jobs), self.config.drain_timeout)
        self.draining = True
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout
        while self.jobs and time.monotonic() < deadline and self.engine.state is not LoopState.STARTING:
            await asyncio.sleep(DRAIN_POLL_S)
        for job in list(self.jobs.values()):
            log.warning("drain timeout: aborting %s", job.request_id)
            job.fail("the worker shut down before the request finished", kind="drain")
            self.close_job(job, kind="drain")
        self.exit_code = 0
        self.exit_event.set()

    # -- the app ---------------------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=APP_MAX_BODY,
                              middlewares=[self._errors_middleware, self._secret_middleware])
        app["server"] = self
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_get("/info", self.info_view)
        ROLE_ROUTES[self.config.engine.role](app, self)
        return app

    @web.middleware
    async def _errors_middleware(self, request: web.Request, handler):
        """Every failure becomes an OpenAI-shaped answer; nothing escapes as aiohttp's HTML 500."""
        try:
            return await handler(request)
        except RequestError as exc:
            if not exc.counted:
                self.metrics.count_error(exc.kind)
            return exc.response()
        except web.HTTPException as exc:  # aiohttp's own: 404 unknown route, 405 wrong method, 413...
            if exc.status < 400:
                raise
            return error_response(exc.reason, status=exc.status, headers={
                k: v for k, v in exc.headers.items() if k.lower() == "allow"})
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client went away; the handler's finally blocks did the cleanup
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            self.metrics.count_error("internal")
            return error_response("internal error in the worker (logged)", status=500, type="internal_error")

    @web.middleware
    async def _secret_middleware(self, request: web.Request, handler):
        """Only the deployment's gateways and workers, which hold the revision's secret, reach the request routes;
        checked before the body is read or the request admitted."""
        if self.config.secret is not None and request.path not in OPEN_PATHS:
            given = request.headers.get(SECRET_HEADER)
            if given is None:
                raise RequestError(f"this worker serves its deployment's gateways and workers only: send the "
                                   f"revision's worker secret in the {SECRET_HEADER} header", status=401,
                                   type="authentication_error", code="missing_worker_secret", kind="unauthorized")
            if not secret_matches(self.config.secret, given):
                raise RequestError(f"the {SECRET_HEADER} header does not hold this worker's secret (a gateway or "
                                   "worker of another deployment or revision?)", status=403,
                                   type="authentication_error", code="wrong_worker_secret", kind="unauthorized")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        status, reason = self.health_status()
        if status == "ok":
            return web.json_response({"status": "ok", "role": self.config.engine.role, "model": self.config.model_name,
                                      "revision": self.config.revision, "dtype": self.info["dtype"],
                                      "kv_cache_dtype": self.info.get("kv_cache_dtype", self.info["dtype"]),
                                      "max_model_len": self.info["max_model_len"],
                                      "quantization": self.info["quantization"],
                                      "weight_bytes": self.info["weight_bytes"],
                                      "prefix_caching": self.info["prefix_caching"],
                                      # What it runs at once: the gateway admits about this many (admission.py).
                                      "max_num_seqs": self.info.get("max_num_seqs"),
                                      # What it admits now: fewer where its requests' ITL objective bounds the
                                      # decode batch (inference/engine/batch_limit.py).
                                      "batch_limit": self.engine.stats.get("batch_limit"),
                                      **({"max_prompt_chars": self.info["max_prompt_chars"]}
                                         if self.info.get("max_prompt_chars") else {}),
                                      **self.markers})
        return web.json_response({"status": status, "reason": reason, **self.markers}, status=503)

    def health_status(self) -> tuple[str, str]:
        el = self.engine
        if self.draining:
            return "draining", "the worker is draining before shutdown"
        if el.state is LoopState.STARTING or (el.state is LoopState.READY and not self.info):
            # READY but not yet published to this thread (wait_loaded): handlers still lack the tokenizer.
            return "starting", el.reason or "publishing the loaded model"
        if el.state is not LoopState.READY or not el.is_alive():
            return "dead", el.reason or "the engine loop thread is not running"
        idle_for = el.seconds_since_heartbeat()
        if idle_for > self.config.stall_timeout:
            return "dead", f"the engine loop has not ticked for {idle_for:.1f}s (stuck)"
        return "ok", ""

    async def metrics_view(self, request: web.Request) -> web.Response:
        # Rendering walks the registry (and NVML): off the event loop, it can take milliseconds.
        body = await asyncio.get_running_loop().run_in_executor(None, self.metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def info_view(self, request: web.Request) -> web.Response:
        if not self.info:
            raise RequestError("the model is still loading", status=503, type="unavailable", code="starting")
        stats = self.engine.stats
        return web.json_response({**self.info, "num_kv_blocks": stats.get("num_kv_blocks_total"),
                                  # Each stage against the host's roofline (inference.roofline); None: not known.
                                  "roofline": stats.get("roofline"),
                                  # What bounds the decode batch under an ITL objective (batch_limit.py).
                                  "batch_limit": stats.get("batch_limit"),
                                  "decode_step": _decode_step(stats.get("decode_step_fit")),
                                  "prefix_cache": {key.removeprefix("prefix_cache_"): stats.get(key, 0) for key in
                                                   ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens",
                                                    "prefix_cache_blocks")}})

    # -- admission and requests (the RoleHost of seams.py) -------------------------------------------------------

    def check_admission(self) -> None:
        """503 while draining or not ready; 429 while the worker holds its admission limit of requests."""
        if self.draining:
            raise RequestError("the worker is draining; send the request to another worker", status=503,
                               type="unavailable", code="draining", headers={"Retry-After": str(RETRY_AFTER_S)})
        status, reason = self.health_status()
        if status != "ok":
            raise RequestError(f"the worker is not ready ({status}: {reason})", status=503, type="unavailable",
                               code=status, headers={"Retry-After": str(RETRY_AFTER_S)})
        if len(self.jobs) >= self.config.max_in_flight:
            raise RequestError(f"the worker is full ({len(self.jobs)} requests in flight); retry later",
                               status=429, type="overloaded", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)})

    async def read_body(self, request: web.Request, limit: int | Callable[[dict], int]) -> bytes:
        """Admit the request (draining, readiness, the in-flight limit), then read its body; a callable limit is
        asked with the loaded model's info once the request is admitted."""
        self.check_admission()
        return await self._read(request, limit(self.info) if callable(limit) else limit)

    async def read_generate(self, request: web.Request, *, need_decode_url: bool) -> tuple[GenerateRequest,
                                                                                            list[int]]:
        """An admitted /v1/generate or /v1/prefill body: checked, tokenized, and fitted to this worker's context."""
        req = parse_generate(parse_json(await self.read_body(request, self.config.max_body_bytes)),
                             need_decode_url=need_decode_url)
        prompt_ids = await self.engine.tokenize(req.prompt, req.messages)
        if not prompt_ids:
            raise RequestError("the prompt tokenizes to no tokens", param="prompt")
        req.fit_to_context(len(prompt_ids), self.info, self.vocab_size)
        return req, prompt_ids

    async def _read(self, request: web.Request, limit: int) -> bytes:
        """The body, or 413 as soon as it is known to exceed `limit` (from Content-Length, else while reading)."""
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(f"request body of {request.content_length} bytes exceeds the limit of {limit}",
                               status=413)
        chunks, size = [], 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise RequestError(f"request body exceeds the limit of {limit} bytes", status=413)
            chunks.append(chunk)

    def open_job(self, request_id: str | None, arrival: float) -> jobs.Job:
        """Register a request under its id (409 if that id is open here); the caller must `close_job` it."""
        self.check_admission()  # again: other requests may have been admitted while this one was read
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        if request_id in self.jobs:
            raise RequestError(f"request_id {request_id!r} is already in flight on this worker", status=409,
                               param="request_id", code="duplicate_request_id")
        job = jobs.Job(request_id, arrival, health=self.health_status, metrics=self.metrics)
        self.jobs[request_id] = job
        return job

    def find_job(self, request_id: str) -> jobs.Job | None:
        return self.jobs.get(request_id)

    def submit(self, job: jobs.Job, prompt_token_ids: list[int], params, stop: list[str], *,
               first_token_id: int | None = None, kv: tuple | None = None, num_resumed_tokens: int = 0,
               cache_salt: bytes = b"", priority: int = STANDARD_PRIORITY, itl_target_s: float | None = None) -> None:
        """`prompt_token_ids` ends with the `num_resumed_tokens` a resumed request generated before."""
        self.engine.submit(EngineRequest(job.request_id, prompt_token_ids, params, stop, job.emit,
                                         job.arrival, first_token_id, kv, num_resumed_tokens, cache_salt, priority,
                                         itl_target_s))
        job.submitted = True

    def close_job(self, job: jobs.Job, *, kind: str = "client_disconnect") -> None:
        """Forget a request; if the engine may still hold it, abort it there (frees its KV blocks) and count the
        error under `kind` (a handler that ends early does so because its client went away)."""
        if self.jobs.get(job.request_id) is job:
            del self.jobs[job.request_id]
        job.cancel_claim_timer()
        if job.submitted and not job.finished:
            job.finished = True
            self.engine.abort(job.request_id)
            self.metrics.count_error(kind)


def _decode_step(fit: tuple[float, float] | None) -> dict | None:
    """The fitted decode step: seconds = fixed_s + per_sequence_s * sequences (None before one was fitted)."""
    return None if fit is None else {"fixed_s": round(fit[0], 6), "per_sequence_s": round(fit[1], 6)}


async def serve(config: WorkerConfig) -> int:
    """One worker as a process: serve until SIGTERM/SIGINT, then drain; the exit code (1: the model did not load)."""
    server = WorkerServer(config)
    try:
        # A simulated worker's open streams end at once on close: nothing is worth waiting for there.
        await server.start(shutdown_timeout=1.0 if config.simulated else 5.0)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        return 1
    if config.secret is None:
        log.warning("no worker secret ($%s): the request routes answer anyone who reaches port %s", SECRET_ENV,
                    config.port)
    if config.simulated:
        log.info("simulated %s worker (profile %s) listening on http://%s:%s", config.engine.role,
                 config.engine.profile.name, config.host, config.port)
    else:
        log.info("listening on http://%s:%s (role %s), loading %s", config.host, config.port, config.engine.role,
                 config.engine.model)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.begin_drain)
    await server.exit_event.wait()
    await server.close()
    log.info("exit %d", server.exit_code)
    return server.exit_code or 0
