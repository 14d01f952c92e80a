"""A simulated worker's HTTP server: the routes of a real worker (docs/contracts.md, "Worker HTTP API"), answered
by `SimEngine` and marked `simulated` in /health, /info and /metrics.

`SimWorker` is one worker bound to its own host:port; `serve_one` runs one as a process (`python -m inference.worker
--simulate PROFILE ...`), `inference.worker.sim.host` runs many in one process. Requests are checked by the same
`inference.worker.protocol` functions a real worker uses, so a bad request gets the same 4xx.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from functools import partial
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import Gauge

from inference import ndjson
from inference.metrics import CONTENT_TYPE, TandemMetrics
from inference.worker.protocol import (REQUEST_ID_RE, RequestError, error_response, fit_max_tokens, parse_generate,
                                       parse_json, parse_sampling)
from inference.worker.sim.engine import SimEngine, SimSequence, tokenize
from inference.worker.sim.kv import FakeKVError, decode_fake_payload, encode_fake_payload
from inference.worker.sim.profile import Profile, ProfileError, load_profile

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
KV_BODY_LIMIT = 64 << 20


@dataclass(slots=True)
class SimConfig:
    profile: Profile
    role: str
    model: str  # what the worker serves, as a real worker names it: the model folder's name
    port: int
    host: str = "127.0.0.1"
    revision: str | None = None
    max_num_seqs: int = 64
    max_queue: int = 256
    drain_timeout: float = 30.0
    max_body_bytes: int = 1 << 20
    kv_push_timeout: float = 30.0
    stream_claim_timeout: float = 30.0

    @property
    def model_name(self) -> str:
        return Path(self.model).name or self.model


def sim_config_from_args(args: dict) -> SimConfig:
    """From the worker's parsed command line (inference.worker.config.build_parser); engine flags that only a model
    would use (device, dtype, threads, KV sizing) are accepted and ignored. Raises ProfileError."""
    profile = load_profile(args["simulate"])
    profile.role(args["role"])  # the profile must describe this role
    return SimConfig(profile=profile, role=args["role"], model=args["model"], port=args["port"], host=args["host"],
                     revision=args.get("revision"), max_num_seqs=args.get("max_num_seqs") or 64,
                     max_queue=args.get("max_queue", 256), drain_timeout=args.get("drain_timeout", 30.0),
                     max_body_bytes=args.get("max_body_bytes", 1 << 20),
                     kv_push_timeout=args.get("kv_push_timeout", 30.0),
                     stream_claim_timeout=args.get("stream_claim_timeout", 30.0))


class SimWorker:
    def __init__(self, config: SimConfig, *, process_metrics: bool = True):
        self.config = config
        self.metrics = TandemMetrics(role=config.role, model=config.model_name, process=process_metrics, gpu=False)
        layout = config.profile.kv_layout
        self.metrics.set_worker_info(dtype=layout["dtype"], dtype_requested=layout["dtype"],
                                     revision=config.revision or "")
        Gauge("tandem_worker_simulated", "1: this worker is simulated (no model; latencies from a profile).",
              ("role", "model", "profile"), registry=self.metrics.registry).labels(
            role=config.role, model=config.model_name, profile=config.profile.name).set(1)
        self.engine = SimEngine(config.profile, config.role, self.metrics, max_num_seqs=config.max_num_seqs)
        costs = config.profile.role(config.role)
        self.info = {"role": config.role, "model": config.model_name, "model_path": config.model,
                     "revision": config.revision, "dtype": layout["dtype"], "dtype_requested": layout["dtype"],
                     "dtype_reason": "simulated: the KV layout's dtype",
                     "max_model_len": min(config.profile.max_model_len, self.engine.capacity_tokens),
                     "configured_max_model_len": config.profile.max_model_len,
                     "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": None,
                     "kv_layout": dict(layout), "simulated": True, "profile": config.profile.name,
                     # The simulated engine holds no KV blocks, so it reuses no prompt prefix: said as a real
                     # worker with prefix caching off says it (the gateway's and pages' reading of /health, /info).
                     "prefix_caching": False,
                     "kv_bytes_per_token": costs.kv_bytes_per_token}
        self.jobs: dict[str, SimSequence] = {}
        self.accepted: dict[str, asyncio.TimerHandle] = {}  # decode: received, waiting for its stream
        self.draining = False
        self.stopped = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=KV_BODY_LIMIT, middlewares=[self._errors])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_get("/info", self.info_view)
        if self.config.role == "colocated":
            app.router.add_post("/v1/generate", self.generate)
        elif self.config.role == "prefill":
            app.router.add_post("/v1/prefill", self.prefill)
        else:
            app.router.add_post("/v1/kv", self.receive_kv)
            app.router.add_get("/v1/stream/{request_id}", self.stream)
        return app

    async def start(self) -> None:
        """Bind host:port and serve (raises OSError when the port is taken)."""
        self.session = aiohttp.ClientSession()
        self.runner = web.AppRunner(self.build_app(), handler_cancellation=True, access_log=None,
                                    shutdown_timeout=1.0)
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, self.config.host, self.config.port).start()
        except OSError:
            await self.close()
            raise

    async def drain_and_close(self) -> None:
        """As SIGTERM on a real worker: refuse new requests, let open ones finish for drain_timeout, close."""
        self.draining = True
        deadline = time.monotonic() + self.config.drain_timeout
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for seq in list(self.jobs.values()):
            self._close(seq, kind="drain")
        await self.close()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()
        self.stopped.set()

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except RequestError as exc:
            self.metrics.count_error(exc.kind)
            return exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.reason, status=exc.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            self.metrics.count_error("internal")
            return error_response("internal error in the simulated worker (logged)", status=500,
                                  type="internal_error")

    # -- shared routes ---------------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining", "reason": "the worker is draining before shutdown",
                                      "simulated": True}, status=503)
        return web.json_response({"status": "ok", "role": self.config.role, "model": self.config.model_name,
                                  "revision": self.config.revision, "dtype": self.info["dtype"],
                                  "max_model_len": self.info["max_model_len"], "simulated": True,
                                  "profile": self.config.profile.name,
                                  "prefix_caching": self.info["prefix_caching"]})

    async def metrics_view(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def info_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    def _check_admission(self) -> None:
        if self.draining:
            raise RequestError("the worker is draining; send the request to another worker", status=503,
                               type="unavailable", code="draining", headers={"Retry-After": str(RETRY_AFTER_S)})
        if len(self.jobs) >= self.config.max_num_seqs + self.config.max_queue:
            raise RequestError(f"the worker is full ({len(self.jobs)} requests in flight); retry later",
                               status=429, type="overloaded", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)})

    async def _read(self, request: web.Request, limit: int) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(f"request body of {request.content_length} bytes exceeds the limit of {limit}",
                               status=413)
        body = await request.content.read(limit + 1)
        if len(body) > limit:
            raise RequestError(f"request body exceeds the limit of {limit} bytes", status=413)
        return body

    def _open(self, request_id: str | None, num_prompt_tokens: int, max_tokens: int, stop: list[str],
              arrival: float) -> SimSequence:
        self._check_admission()
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        if request_id in self.jobs:
            raise RequestError(f"request_id {request_id!r} is already in flight on this worker", status=409,
                               param="request_id", code="duplicate_request_id")
        seq = SimSequence(request_id, num_prompt_tokens, max_tokens, stop, arrival)
        self.jobs[request_id] = seq
        return seq

    def _close(self, seq: SimSequence, *, kind: str | None = None) -> None:
        if self.jobs.get(seq.request_id) is seq:
            del self.jobs[seq.request_id]
        timer = self.accepted.pop(seq.request_id, None)
        if timer is not None:
            timer.cancel()
        if seq.finish_reason is None and not seq.aborted:
            self.engine.abort(seq)
            if kind:
                self.metrics.count_error(kind)

    async def _parse_request(self, request: web.Request, *, need_decode_url: bool):
        self._check_admission()
        req = parse_generate(parse_json(await self._read(request, self.config.max_body_bytes)),
                             need_decode_url=need_decode_url)
        text = req.prompt if req.prompt is not None else " ".join(m["content"] for m in req.messages)
        prompt_ids = tokenize(text, self.config.profile.vocab_size) or [1]
        req.fit_to_context(len(prompt_ids), self.info, self.config.profile.vocab_size)
        return req, prompt_ids

    async def _stream(self, request: web.Request, seq: SimSequence) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": ndjson.CONTENT_TYPE, "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(ndjson.encode({"type": "start", "request_id": seq.request_id,
                                            "prompt_tokens": seq.num_prompt_tokens}))
        while True:
            event = await seq.events.get()
            if event[0] == "token":
                await response.write(ndjson.encode({"type": "token", "token_ids": [event[1]], "text": event[2]}))
                continue
            await response.write(ndjson.encode({"type": "done", "finish_reason": event[1],
                                                "prompt_tokens": seq.num_prompt_tokens,
                                                "completion_tokens": seq.num_generated}))
            break
        await response.write_eof()
        return response

    # -- colocated -------------------------------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req, prompt_ids = await self._parse_request(request, need_decode_url=False)
        seq = self._open(req.request_id, len(prompt_ids), req.params.max_tokens, req.stop, arrival)
        stream = asyncio.ensure_future(self._stream(request, seq))
        try:
            await self.engine.prefill(seq)
            if seq.finish_reason is None:
                self.engine.add(seq)
            return await stream
        finally:
            stream.cancel()
            self._close(seq, kind="client_disconnect")

    # -- prefill ---------------------------------------------------------------------------------------------------

    async def prefill(self, request: web.Request) -> web.Response:
        arrival = time.monotonic()
        req, prompt_ids = await self._parse_request(request, need_decode_url=True)
        seq = self._open(req.request_id, len(prompt_ids), req.params.max_tokens, req.stop, arrival)
        try:
            first = await self.engine.prefill(seq)
            answer = {"request_id": seq.request_id, "prompt_tokens": len(prompt_ids), "first_token_id": first,
                      "text": seq.text, "finished": seq.finish_reason is not None,
                      "finish_reason": seq.finish_reason, "kv_bytes": 0, "kv_transfer_seconds": 0.0,
                      "simulated": True}
            if seq.finish_reason is None:
                header = {"request_id": seq.request_id, "prompt_token_ids": prompt_ids, "first_token_id": first,
                          "sampling": req.sampling_header(), "kv_layout": self.info["kv_layout"],
                          "revision": self.config.revision}
                answer["kv_bytes"], answer["kv_transfer_seconds"] = await self._push_kv(req.decode_url, header)
                self.metrics.count_success("handoff")
            else:
                self.metrics.count_success(seq.finish_reason)
            self.metrics.e2e_request_latency.observe(time.monotonic() - arrival)
            seq.finish_reason = seq.finish_reason or "handoff"
            return web.json_response(answer)
        finally:
            self._close(seq, kind="client_disconnect")

    async def _push_kv(self, decode_url: str, header: dict) -> tuple[int, float]:
        started = time.monotonic()
        data = encode_fake_payload(header, self.info["kv_layout"])
        timeout = aiohttp.ClientTimeout(total=self.config.kv_push_timeout)
        try:
            async with self.session.post(f"{decode_url}/v1/kv", data=data, timeout=timeout,
                                         headers={"Content-Type": "application/octet-stream"}) as r:
                if r.status != 200:
                    detail = (await r.text(errors="replace"))[:300]
                    raise RequestError(f"decode worker {decode_url} refused the KV cache: HTTP {r.status}: {detail}",
                                       status=502, type="kv_transfer_error",
                                       code="decode_full" if r.status == 429 else "decode_rejected")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RequestError(f"decode worker {decode_url} unreachable: {exc!r}", status=502,
                               type="kv_transfer_error", code="decode_unreachable") from None
        seconds = time.monotonic() - started
        self.metrics.kv_transfer_bytes.inc(len(data))
        self.metrics.kv_transfer_seconds.observe(seconds)
        return len(data), seconds

    # -- decode ----------------------------------------------------------------------------------------------------

    async def receive_kv(self, request: web.Request) -> web.Response:
        arrival = time.monotonic()
        self._check_admission()
        body = await self._read(request, KV_BODY_LIMIT)
        try:
            header = decode_fake_payload(body, kv_layout=self.info["kv_layout"])
        except FakeKVError as exc:
            raise RequestError(f"bad KV payload: {exc}", code="bad_kv_payload") from None
        if not REQUEST_ID_RE.match(header["request_id"]):
            raise RequestError("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="request_id")
        params, stop = parse_sampling(header["sampling"])
        num_prompt_tokens = len(header["prompt_token_ids"])
        params = replace(params, max_tokens=fit_max_tokens(num_prompt_tokens, params.max_tokens, self.info))
        seq = self._open(header["request_id"], num_prompt_tokens, params.max_tokens, stop, arrival)
        seq.num_generated, seq.last_token_at = 1, arrival  # the prefill worker's first token
        self.engine.add(seq)
        self.accepted[seq.request_id] = asyncio.get_running_loop().call_later(
            self.config.stream_claim_timeout, partial(self._close, seq, kind="timeout"))
        self.metrics.kv_transfer_bytes.inc(len(body))
        self.metrics.kv_transfer_seconds.observe(time.monotonic() - arrival)
        return web.json_response({"request_id": seq.request_id, "accepted": True,
                                  "prompt_tokens": num_prompt_tokens})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        request_id = request.match_info["request_id"]
        seq = self.jobs.get(request_id)
        timer = self.accepted.pop(request_id, None)
        if seq is None or timer is None:
            raise RequestError(f"no request {request_id!r} on this worker (never received, finished, already "
                               "streamed or not streamed in time)", status=404, param="request_id",
                               code="unknown_request")
        timer.cancel()
        try:
            return await self._stream(request, seq)
        finally:
            self._close(seq, kind="client_disconnect")


async def serve_one(config: SimConfig) -> int:
    """One simulated worker as a process: serve until SIGTERM/SIGINT, then drain."""
    worker = SimWorker(config)
    try:
        await worker.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        return 1
    log.info("simulated %s worker (profile %s) listening on http://%s:%s", config.role, config.profile.name,
             config.host, config.port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: loop.create_task(worker.drain_and_close()))
    await worker.stopped.wait()
    return 0


__all__ = ["ProfileError", "SimConfig", "SimWorker", "serve_one", "sim_config_from_args"]
