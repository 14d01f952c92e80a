"""The gateway's HTTP surface: OpenAI routes, SSE relay, /health, /metrics.

Each generation request: validate (4xx before any worker is touched) → pick the revision group (the newest complete
one, or by traffic weight and variant key under a split, routing.py) → `Relay.start` (up to the first token, with
its one retry) → stream SSE chunks or collect one JSON answer (the stream moves to another worker pair if its worker
dies; only when it cannot does the client see an error). Client-side latencies are measured here, since this
is where the client's bytes leave, labelled with the revision that served. Every answer given after the group was
picked says which one: `X-Tandem-Revision` and, when the membership names it, `X-Tandem-Variant`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable

import aiohttp
from aiohttp import web

from inference.gateway import operator_views, quota_state
from inference.gateway.admission import Admission
from inference.gateway.config import Config
from inference.gateway.key_throttle import KeyThrottle
from inference.gateway.membership import ControlPlaneMembership, apply_static
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.openai_protocol import (
    SSE_DONE, ApiError, ChunkEncoder, Endpoint, GenerationRequest, completion_response, parse_chat,
    parse_completion, parse_json_object, prompt_too_long, sse_error,
)
from inference.gateway.preemption import Preemption, preemption_settings
from inference.gateway.relay import Relay, WorkerRejected
from inference.gateway.request_body import read_body
from inference.gateway.routing import Group, Router
from inference.gateway.served import Served
from inference.gateway.tenancy import OPEN, TenantGate, TenantState, Ticket
from inference.gateway.token_stream import StreamBroken, TokenStream
from inference.gateway.trace_log import TraceEntry, TraceLog

log = logging.getLogger("tandem.gateway")

CONFIG_KEY = web.AppKey("config", Config)
GATEWAY_KEY = web.AppKey("gateway", object)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
VARIANT_KEY_HEADER = "X-Tandem-Variant-Key"


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    response = web.json_response(error.body(), status=error.status, headers={**error.headers, **(headers or {})})
    if error.headers.get("Connection") == "close":
        response.force_close()  # aiohttp would otherwise read the unread body to keep the connection
    return response


def group_headers(group: Group) -> dict[str, str]:
    """Which revision (and variant) served: the static group has no revision, so it says nothing."""
    headers = {}
    if group.revision is not None:
        headers["X-Tandem-Revision"] = str(group.revision)
    if group.variant is not None:
        headers["X-Tandem-Variant"] = group.variant
    return headers


class Gateway:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.model = config.served_model_name
        self.created = int(time.time())
        self.router = Router(config)
        self.metrics = GatewayMetrics(model=self.model, router=self.router)
        self.session: aiohttp.ClientSession | None = None
        self.relay: Relay | None = None
        self.admission = Admission(self.router.capacity, max_queued=config.max_queued,
                                   deadlines=config.queue_deadlines)
        self.preemption = Preemption(self.admission, config.preemption)
        # The deployment's admission settings (polled) override the flags; what they leave out, the flags say.
        self.membership = ControlPlaneMembership(config, self.router, on_admission=self.configure_admission) \
            if config.control_plane_url else None
        # Keys and limits come with the membership (tenancy.py); a static gateway is open.
        self.tenants = TenantGate(lambda: self.membership.tenancy if self.membership is not None else OPEN)
        self.key_throttle = KeyThrottle()  # wrong keys per client address (key_throttle.py)
        self.trace = TraceLog(config.trace_size, config.trace_sample)  # what a replay reads (trace_log.py)
        self.metrics.registry.register(self.tenants.collector(self.model))
        self.metrics.registry.register(self.admission.collector(self.model))
        self.metrics.registry.register(self.preemption.collector(self.model))
        self._tasks: list[asyncio.Task] = []
        self._num_running = 0

    def configure_admission(self, settings: dict) -> None:
        self.admission.configure(max_queued=settings.get("max_queued", self.config.max_queued),
                                 deadlines={**self.config.queue_deadlines, **settings.get("queue_deadlines", {})})
        self.preemption.configure(preemption_settings(settings, self.config.preemption))

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    async def start(self, app: web.Application) -> None:
        # One pooled keep-alive session for every worker call: a fresh TCP connection per request would cost more
        # than the gateway's whole latency budget. No pool limit: backpressure is --max-outstanding-per-worker.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout,
                                        sock_connect=self.config.connect_timeout,
                                        sock_read=self.config.request_timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        self.relay = Relay(self.config, self.router, self.session, on_retry=self.metrics.count_retry,
                           on_migration=self.metrics.count_migration)
        # One membership poll and one health round before the port listens (aiohttp starts the site after its
        # startup hooks): a gateway that starts or restarts in front of a serving fleet answers its first request
        # instead of 503 "no membership yet". Each step is bounded by its own timeout; a control plane that does
        # not answer leaves the gateway listening with the error on /health, as before.
        if self.membership is None:
            apply_static(self.config, self.router)
        else:
            await self.membership.poll_once(self.session)
        await self.router.probe_all(self.session)
        if self.membership is not None:
            self._tasks.append(asyncio.create_task(self.membership.run(self.session), name="membership"))
        self._tasks.append(asyncio.create_task(self.router.run_health_loop(self.session), name="health"))
        self._tasks.append(asyncio.create_task(self.admission.run(), name="admission"))
        if self.config.quota_state is not None:  # tenants' minute of usage from the previous process (quota_state.py)
            quota_state.load(self.tenants, self.config.quota_state)
            self._tasks.append(asyncio.create_task(quota_state.run(self.tenants, self.config.quota_state),
                                                   name="quota-state"))

    async def stop(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.config.quota_state is not None:
            quota_state.save_quietly(self.tenants, self.config.quota_state)
        if self.session is not None:
            await self.session.close()

    @property
    def sampling_defaults(self) -> dict:
        """What fills a field a request leaves out: the deployment's (polled) or the --default-* flags."""
        return self.membership.sampling_defaults if self.membership is not None else self.config.sampling_defaults

    # -- plain routes -------------------------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """operator_views.models; a deployment that requires a key lists its model to a valid key only."""
        try:
            self._identify(request)
        except ApiError as error:
            return error_response(error)
        return operator_views.models(self, request)

    async def health(self, request: web.Request) -> web.Response:
        return await operator_views.health(self, request)

    async def prometheus(self, request: web.Request) -> web.Response:
        return await operator_views.metrics(self, request)

    async def trace_page(self, request: web.Request) -> web.Response:
        return operator_views.trace(self, request)

    @property
    def num_running(self) -> int:
        return self._num_running

    # -- generation ---------------------------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.COMPLETIONS)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, Endpoint.CHAT)

    async def _generate(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        received = time.perf_counter()
        try:
            # The key first (401/404 before the body is read), the tenant's limits once the request is known.
            tenant = self._identify(request)
            body = parse_json_object(await read_body(request, self.config.max_body_bytes, self.router))
            parse = parse_chat if endpoint is Endpoint.CHAT else parse_completion
            gen = parse(body, self.model, self.sampling_defaults)
            ticket = self.tenants.admit(tenant, body, gen.worker_body, caller=gen.user or request.remote or "")
            itl_objective_s = (self.membership.itl_objective_s if self.membership is not None
                               else self.config.itl_objective_s)
            if itl_objective_s is not None:
                gen.worker_body["itl_target_s"] = itl_objective_s
        except ApiError as error:
            # The codes are a fixed set (invalid_json, invalid_type, model_not_found, ...): a bounded label.
            self.metrics.count_error(error.code or "invalid_request")
            return error_response(error)
        trace = self.trace.begin(gen.worker_body, ticket.tenant, ticket.priority_class, received)
        response = None
        try:
            response = await self._serve(request, endpoint, gen, received, ticket, trace)
            return response
        finally:
            ticket.release()  # the tenant's concurrency slot, and its tokens counted from the real usage
            self.trace.end(trace, response)

    def _identify(self, request: web.Request) -> TenantState | None:
        """The caller's tenant (TenantGate.identify), behind the throttle on wrong keys per address."""
        self.key_throttle.check(request.remote)
        try:
            return self.tenants.identify(request.headers.get("Authorization"), self.model)
        except ApiError as error:
            if error.code == "invalid_api_key":
                self.key_throttle.failed(request.remote)
            raise

    async def _serve(self, request: web.Request, endpoint: Endpoint, gen: GenerationRequest, received: float,
                     ticket: Ticket, trace: TraceEntry | None = None) -> web.StreamResponse:
        try:
            # The header wins over the body's `user`: a client can pin its variant without touching its requests.
            group = await self.router.pick_group_probed(request.headers.get(VARIANT_KEY_HEADER) or gen.user)
        except ApiError as error:
            self.metrics.count_error(error.code or "gateway")
            return error_response(error)
        series = self.metrics.requests(revision="" if group.revision is None else str(group.revision))
        headers = group_headers(group)
        too_long = prompt_too_long(gen.worker_body, group.max_prompt_chars())
        if too_long is not None:
            series.count_error(too_long.code)
            return error_response(too_long, headers)
        try:
            # A slot among the requests that may run at once; waits in the admission queue when none is free.
            ticket.slot = await self.admission.acquire(ticket.tenant, ticket.priority_class)
        except ApiError as error:
            series.count_error(error.code)
            return error_response(error, headers)
        request_id = ("chatcmpl-" if endpoint is Endpoint.CHAT else "cmpl-") + uuid.uuid4().hex
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout
        self._num_running += 1
        # The request may be preempted for a waiting one that outranks it (preemption.py), before or after its first
        # token; either way it goes back to the queue and later resumes where it stopped.
        preemptible = self.preemption.attach(ticket, gen.worker_body.get("max_tokens"))
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    try:
                        stream = await self.preemption.start(preemptible, functools.partial(
                            self._start, group, request_id, gen.worker_body, ticket))
                    except ApiError as error:
                        fallback = self.router.fallback_group(group) if error.status >= 500 else None
                        if fallback is None:
                            raise
                        # A canary failed it before the first token: the failure counts against the canary (its
                        # series feeds the rollout's analysis), and the client gets one try on stable instead.
                        series.count_error(error.code or "gateway")
                        self.metrics.count_retry("canary_failed")
                        log.info("request %s failed on canary revision %s (%s): one more try on stable revision %s",
                                 request_id, group.revision, error.message, fallback.revision)
                        group = fallback
                        series = self.metrics.requests(revision=str(group.revision))
                        headers = group_headers(group)
                        stream = await self.preemption.start(preemptible, functools.partial(
                            self._start, group, f"{request_id}-stable", gen.worker_body, ticket))
            except ApiError as error:
                series.count_error(error.code or "gateway")
                return error_response(error, headers)
            except WorkerRejected as rejected:
                series.count_error("worker_rejected")
                return web.Response(status=rejected.status, body=rejected.body, headers={
                    "Content-Type": rejected.content_type or "application/json", **rejected.headers, **headers})
            except TimeoutError:
                series.count_error("timeout")
                return error_response(self._timed_out("no first token"), headers)
            ticket.stream = stream
            ticket.slot.charge(prompt_tokens=stream.prompt_tokens)
            served = Served(series, headers, received, deadline, ticket, trace)
            try:
                if gen.stream:
                    return await self._stream(request, gen, stream, request_id, served)
                return await self._collect(gen, stream, request_id, served)
            finally:
                await stream.close()
        finally:
            self.preemption.detach(preemptible)
            self._num_running -= 1

    def _start(self, group: Group, request_id: str, body: dict, ticket: Ticket,
               num_preemptions: int) -> Awaitable[TokenStream]:
        # A try after a preemption gets a worker request id of its own: the worker may not have dropped the last one.
        # Once a worker holds it, a request preempted for its slot may close its own leg (Admission.hand_over).
        return self.relay.start(group, f"{request_id}-p{num_preemptions}" if num_preemptions else request_id, body,
                                accepted=ticket.slot.handed_over)

    def _timed_out(self, what: str) -> ApiError:
        return ApiError(504, f"{what} within --request-timeout {self.config.request_timeout}s",
                        type="timeout_error", code="timeout")

    async def _collect(self, gen: GenerationRequest, stream: TokenStream, request_id: str,
                       served: Served) -> web.Response:
        texts = []
        try:
            async with asyncio.timeout_at(served.deadline):
                async for text, num_tokens in stream.deltas():
                    texts.append(text)
                    if num_tokens:
                        served.observe_token(num_tokens)
        except TimeoutError:
            served.series.count_error("timeout")
            return error_response(self._timed_out("the request did not finish"), served.headers)
        except StreamBroken as exc:
            served.series.count_error(exc.kind)
            return error_response(ApiError(502, f"the request failed after it started: {exc.message}",
                                           type="upstream_error", code=exc.kind), served.headers)
        served.observe_finish(stream)
        finish = stream.finish
        return web.json_response(completion_response(
            gen.endpoint, request_id, int(time.time()), self.model, "".join(texts), finish.reason,
            finish.prompt_tokens, finish.completion_tokens), headers=served.headers)

    async def _stream(self, request: web.Request, gen: GenerationRequest, stream: TokenStream, request_id: str,
                      served: Served) -> web.StreamResponse:
        # The revision headers go on the response head: a streaming client reads them before the first chunk.
        response = web.StreamResponse(headers={**SSE_HEADERS, **served.headers})
        encoder = ChunkEncoder(gen.endpoint, request_id, int(time.time()), self.model, gen.include_usage)
        try:
            await response.prepare(request)
            try:
                async with asyncio.timeout_at(served.deadline):
                    async for text, num_tokens in stream.deltas():
                        if text:
                            await response.write(encoder.text(text))
                        if num_tokens:
                            served.observe_token(num_tokens)
            except (StreamBroken, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    # The overall deadline hit mid-stream: end the stream in-band rather than with a 504.
                    exc = StreamBroken("timeout", f"the request ran past --request-timeout "
                                                  f"{self.config.request_timeout}s")
                served.series.count_error(exc.kind)
                await response.write_eof(sse_error(ApiError(
                    502, f"the request failed after it started: {exc.message}", type="upstream_error",
                    code=exc.kind)) + SSE_DONE)
                return response
            # One send for the tail and the end of the chunked body: each send costs more than encoding all this.
            tail = encoder.finish(stream.finish.reason)
            if gen.include_usage:
                tail += encoder.usage(stream.finish.prompt_tokens, stream.finish.completion_tokens)
            # Free the workers' and the tenant's slots before the client reads [DONE]: a client that sends its next
            # request at once must find them free (stream.close is idempotent; _serve's finally calls it again).
            await stream.close()
            served.ticket.release()
            await response.write_eof(tail + SSE_DONE)
            served.observe_finish(stream)
        except ConnectionResetError:
            # The client went away; closing the stream (in _generate) aborts the request on the worker.
            served.series.count_error("client_disconnected")
        return response


@web.middleware
async def openai_errors(request: web.Request, handler):
    """Unknown routes and wrong methods answer in OpenAI's error shape too, so clients parse every error alike."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}",
                                       code="not_found" if exc.status == 404 else None))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        # A bug, not a client error: logged with its traceback, answered in the shape clients parse.
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal gateway error (logged)", type="server_error",
                                       code="internal_error"))


def build_app(config: Config) -> web.Application:
    gateway = Gateway(config)
    # client_max_size backs up _read_body's Content-Length check for chunked bodies.
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[openai_errors])
    app[CONFIG_KEY] = config
    app[GATEWAY_KEY] = gateway
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_post("/v1/completions", gateway.completions)
    app.router.add_post("/v1/chat/completions", gateway.chat_completions)
    app.router.add_get("/v1/models", gateway.models)
    app.router.add_get("/health", gateway.health)
    app.router.add_get("/metrics", gateway.prometheus)
    app.router.add_get("/trace", gateway.trace_page)
    return app
