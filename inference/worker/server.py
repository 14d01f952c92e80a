"""The worker's HTTP server: lifecycle, admission, the routes every role shares, and drain on SIGTERM.

Order of life:
1. bind the port and answer at once (/health says 503 "starting" while the engine thread loads the model);
2. serve; /health is 200 only while the engine loop ticks;
3. on SIGTERM/SIGINT: refuse new requests (503, /health "draining"), let open ones finish for --drain-timeout,
   abort the rest, stop the engine thread, exit 0.
A model that fails to load makes the process exit 1 (a node agent sees a crash, not a zombie that answers 503).

The role's routes (`colocated`, `prefill`, `decode`) are handed this server and call back into it for admission,
body limits, tokenizing and jobs; `jobs` gets only the engine-loop health and the metrics it needs.

Test aid: with `--enable-test-faults` (never passed by the control plane) the worker also serves
`POST /debug/fault {"kind": "die" | "step_error" | "stall", "seconds": S}`, which breaks its engine loop on demand
(a stall lasts S seconds, 0 < S <= 60, STALL_FAULT_S unless told). With
`--test-fault error | slow:<seconds>` (faults.py) every generation request fails or crawls, while /health stays ok
and says `test_fault`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from inference.engine.config import QUANTIZATION_NOTES
from inference.metrics import CONTENT_TYPE, TandemMetrics
from inference.roles import Role
from inference.worker import colocated, decode, jobs, prefill
from inference.worker.config import WorkerConfig
from inference.worker.engine_loop import STALL_FAULT_S, EngineLoop, LoopState, Submission
from inference.worker.protocol import RequestError, error_response, parse_json

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
DRAIN_POLL_S = 0.05
# aiohttp's own cap on request bodies; each route enforces its tighter limit while reading (see read_body).
APP_MAX_BODY = 1 << 40
ROLE_ROUTES = {Role.COLOCATED: colocated.add_routes, Role.PREFILL: prefill.add_routes,
               Role.DECODE: decode.add_routes}


class WorkerServer:
    def __init__(self, config: WorkerConfig):
        self.config = config
        self.metrics = TandemMetrics(role=config.engine.role, model=config.model_name)
        self.engine_loop = EngineLoop(self._make_engine, self.metrics, role=config.engine.role,
                                      faults_enabled=config.enable_test_faults)
        self.jobs: dict[str, jobs.Job] = {}
        self.draining = False
        self.exit_code: int | None = None
        self.exit_event = asyncio.Event()
        # One thread for the tokenizer, so that no two calls race inside the Rust tokenizer.
        self.tokenize_executor = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        self.tokenizer = None
        self.info: dict = {}
        self.vocab_size = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    def _make_engine(self):
        from inference.engine import LLMEngine  # torch: on the engine thread, while /health answers "starting"

        if self.config.test_load_delay:
            time.sleep(self.config.test_load_delay)
        return LLMEngine(self.config.engine)

    # -- the app ---------------------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=APP_MAX_BODY, middlewares=[self._errors_middleware])
        app["server"] = self
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_get("/info", self.info_view)
        if self.config.enable_test_faults:
            app.router.add_post("/debug/fault", self.fault_view)
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

    async def health(self, request: web.Request) -> web.Response:
        status, reason = self.health_status()
        fault = {"test_fault": self.config.test_fault} if self.config.fault else {}
        if status == "ok":
            return web.json_response({"status": "ok", "role": self.config.engine.role, "model": self.config.model_name,
                                      "revision": self.config.revision, "dtype": self.info["dtype"],
                                      "max_model_len": self.info["max_model_len"],
                                      "quantization": self.info["quantization"],
                                      "weight_bytes": self.info["weight_bytes"],
                                      "prefix_caching": self.info["prefix_caching"], **fault})
        return web.json_response({"status": status, "reason": reason, **fault}, status=503)

    def health_status(self) -> tuple[str, str]:
        el = self.engine_loop
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
        stats = self.engine_loop.stats
        return web.json_response({**self.info, "num_kv_blocks": stats.get("num_kv_blocks_total"),
                                  "prefix_cache": {key.removeprefix("prefix_cache_"): stats.get(key, 0) for key in
                                                   ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens",
                                                    "prefix_cache_blocks")}})

    async def fault_view(self, request: web.Request) -> web.Response:
        """Test aid (--enable-test-faults only): break the engine loop as the request's `kind` says."""
        body = parse_json(await self.read_body(request, self.config.max_body_bytes))
        kind = body.get("kind") if isinstance(body, dict) else None
        if kind not in ("die", "step_error", "stall"):
            raise RequestError("kind must be die, step_error or stall", param="kind")
        seconds = body.get("seconds", STALL_FAULT_S)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 60:
            raise RequestError(f"seconds must be a number in (0, 60], got {seconds!r}", param="seconds")
        self.engine_loop.inject_fault(kind, float(seconds))
        return web.json_response({"injected": kind, "seconds": float(seconds)})

    # -- admission and requests ------------------------------------------------------------------------------------

    def check_test_fault(self) -> None:
        """--test-fault error: fail the request with a 500 before it touches the engine (faults.py)."""
        if self.config.fault and self.config.fault.error:
            raise RequestError("this worker runs with --test-fault error (a test aid): it fails every request",
                               status=500, type="test_fault", code="test_fault", kind="test_fault")

    async def test_fault_delay(self) -> None:
        """--test-fault slow:<seconds>: wait before a token (or a prefill step) without holding up the event loop."""
        if self.config.fault and self.config.fault.delay_s:
            await asyncio.sleep(self.config.fault.delay_s)

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

    async def read_body(self, request: web.Request, limit: int) -> bytes:
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
        slow = self.config.fault is not None and self.config.fault.delay_s > 0
        job = jobs.Job(request_id, arrival, health=self.health_status, metrics=self.metrics,
                       token_delay=self.test_fault_delay if slow else None)
        self.jobs[request_id] = job
        return job

    def submit(self, job: jobs.Job, prompt_token_ids: list[int], params, stop: list[str], *,
               first_token_id: int | None = None, kv: tuple | None = None, num_resumed_tokens: int = 0) -> None:
        """`prompt_token_ids` ends with the `num_resumed_tokens` a resumed request generated before."""
        self.engine_loop.submit(Submission(job.request_id, prompt_token_ids, params, stop, job.emit_threadsafe,
                                           job.arrival, first_token_id, kv, num_resumed_tokens))
        job.submitted = True

    def close_job(self, job: jobs.Job, *, kind: str = "client_disconnect") -> None:
        """Forget a request; if the engine may still hold it, abort it there (frees its KV blocks) and count the
        error under `kind` (a handler that ends early does so because its client went away)."""
        if self.jobs.get(job.request_id) is job:
            del self.jobs[job.request_id]
        job.cancel_claim_timer()
        if job.submitted and not job.finished:
            job.finished = True
            self.engine_loop.abort(job.request_id)
            self.metrics.count_error(kind)

    async def tokenize(self, prompt: str | None, messages: list[dict] | None) -> list[int]:
        tokenizer = self.tokenizer

        def run() -> list[int]:
            if messages is not None:
                if not getattr(tokenizer, "chat_template", None):
                    raise RequestError("this model has no chat template; send 'prompt' instead of 'messages'",
                                       param="messages")
                try:
                    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                except Exception as exc:  # templates raise on what they refuse (roles out of order, ...)
                    raise RequestError(f"the model's chat template refused the messages: {exc}",
                                       param="messages") from None
                # The template writes any BOS itself; adding special tokens again would double it.
                return tokenizer.encode(text, add_special_tokens=False)
            return tokenizer.encode(prompt)

        ids = await asyncio.get_running_loop().run_in_executor(self.tokenize_executor, run)
        if not ids:
            raise RequestError("the prompt tokenizes to no tokens", param="prompt")
        return ids

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def wait_loaded(self) -> None:
        """Wait for the engine thread to finish loading; then publish what /info and handlers need."""
        while not self.engine_loop.loaded.is_set():
            await asyncio.sleep(0.05)
        engine = self.engine_loop.engine
        if engine is None:
            log.error("%s", self.engine_loop.reason)
            self.exit_code = 1
            self.exit_event.set()
            return
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.model_runner.vocab_size
        self.info = {"role": self.config.engine.role, "model": self.config.model_name,
                     "model_path": str(Path(self.config.engine.model).resolve()), "revision": self.config.revision,
                     "dtype": engine.dtype, "dtype_requested": self.config.engine.dtype,
                     "dtype_reason": engine.dtype_reason,
                     # max_model_len: the context a request can have here, at most what the KV pool holds.
                     "max_model_len": engine.max_model_len,
                     "configured_max_model_len": engine.configured_max_model_len,
                     # The batch limits it runs with: a revision's per-role settings, as this worker got them.
                     "max_num_seqs": self.config.engine.max_num_seqs,
                     "max_num_batched_tokens": self.config.engine.max_num_batched_tokens,
                     "kv_layout": dict(engine.kv_layout),
                     "quantization": engine.quantization, "weight_bytes": engine.weight_bytes,
                     "bit_identical": engine.quantization == "none",
                     # What runs (off on a decode worker, whatever was asked): the gateway routes by prefix affinity
                     # to workers that say true in /health.
                     "prefix_caching": engine.prefix_caching,
                     # Speculative decoding ({"method": ..., "num_tokens": ...} with its defaults) or None: off.
                     "speculative": engine.speculative}
        if engine.quantization in QUANTIZATION_NOTES:
            self.info["note"] = QUANTIZATION_NOTES[engine.quantization]
        if self.config.fault:
            self.info["test_fault"] = self.config.test_fault
        self.metrics.set_worker_info(dtype=engine.dtype, dtype_requested=self.config.engine.dtype,
                                     revision=self.config.revision or "", quantization=engine.quantization)
        self.metrics.model_weight_bytes.set(engine.weight_bytes)
        self.metrics.watch_devices([str(engine.model_runner.device)],
                                   visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        log.info("ready: %s", self.info)

    def begin_drain(self) -> None:
        if self.draining or self.exit_event.is_set():
            return
        log.info("draining: %d requests in flight, up to %.0fs", len(self.jobs), self.config.drain_timeout)
        self.draining = True
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout
        while self.jobs and time.monotonic() < deadline and self.engine_loop.loaded.is_set():
            await asyncio.sleep(DRAIN_POLL_S)
        for job in list(self.jobs.values()):
            log.warning("drain timeout: aborting %s", job.request_id)
            job.fail("the worker shut down before the request finished", kind="drain")
            self.close_job(job, kind="drain")
        self.exit_code = 0
        self.exit_event.set()


async def serve(config: WorkerConfig) -> int:
    server = WorkerServer(config)
    server.loop = asyncio.get_running_loop()
    runner = web.AppRunner(server.build_app(), handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        await runner.cleanup()
        return 1
    log.info("listening on http://%s:%s (role %s), loading %s", config.host, config.port, config.engine.role,
             config.engine.model)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.begin_drain)
    server.engine_loop.start()
    loader = loop.create_task(server.wait_loaded())
    await server.exit_event.wait()
    loader.cancel()
    await runner.cleanup()
    server.engine_loop.stop(timeout=10.0 if server.engine_loop.loaded.is_set() else 0.1)
    server.tokenize_executor.shutdown(wait=False)
    log.info("exit %d", server.exit_code)
    return server.exit_code or 0
