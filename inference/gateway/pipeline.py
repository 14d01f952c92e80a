"""A generation request's path through the gateway, one step each:

1. identify: the caller's key, before the body is read (401 for a key no deployment here knows);
2. parse: the body, bounded by its length (request_body.py), as OpenAI's JSON (400 naming the field);
3. deployment: the one whose model the body names (404 `model_not_found` for another), and the caller's tenant there
   (401, or 404 for a tenant that may not use it);
4. admit: the request validated into the worker's body with the deployment's sampling defaults, then the tenant's
   limits (400 / 429, tenant_quota.py);
5. pick group: the revision that serves it (routing.py; a traffic split's variant by `X-Tandem-Variant-Key` or the
   body's `user`), and a prompt too long for its workers refused (400);
6. acquire slot: a place among the requests that may run at once, waiting in the deployment's admission queue when
   none is free (admission.py; 429 / 503 when shed);
7. relay: up to the first token, with its one retry, a canary's failure retried once on stable, and preemption
   (relay.py, preemption.py);
8. respond: SSE chunks or one JSON answer (the stream moves to another worker pair if its worker dies; only when it
   cannot does the client see an error).

Client-side latencies are measured here, since this is where the client's bytes leave, labelled with the deployment's
model and the revision that served. Every answer given after the group was picked says which one:
`X-Tandem-Revision` and, when the membership names it, `X-Tandem-Variant`.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Protocol

from aiohttp import web

from inference.gateway.config import Config
from inference.gateway.deployment import ServedDeployment
from inference.gateway.key_throttle import KeyThrottle
from inference.gateway.openai_protocol import (
    SSE_DONE, ApiError, ChunkEncoder, Endpoint, GenerationRequest, completion_response, parse_chat,
    parse_completion, parse_json_object, prompt_too_long, sse_error,
)
from inference.gateway.relay import WorkerRejected
from inference.gateway.request_body import read_body
from inference.gateway.routing import Group
from inference.gateway.served import Served
from inference.gateway.tenancy import TenantState, Ticket
from inference.gateway.token_stream import StreamBroken, TokenStream
from inference.gateway.trace_log import TraceEntry

log = logging.getLogger("tandem.gateway")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
VARIANT_KEY_HEADER = "X-Tandem-Variant-Key"


class Gateway(Protocol):
    """What the steps read of the gateway (app.Gateway)."""

    config: Config
    key_throttle: KeyThrottle

    def identify_caller(self, request: web.Request) -> None: ...
    def deployment_for(self, body: dict) -> ServedDeployment: ...
    def served(self) -> list[ServedDeployment]: ...
    def count_refusal(self, served: ServedDeployment | None, code: str) -> None: ...


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


def identify(gateway: Gateway, served: ServedDeployment, request: web.Request) -> TenantState | None:
    """The caller's tenant in `served`, behind the throttle on wrong keys per address (key_throttle.py)."""
    try:
        return served.identify(request.headers.get("Authorization"))
    except ApiError as error:
        if error.code == "invalid_api_key":
            gateway.key_throttle.failed(request.remote)
        raise


async def generate(gateway: Gateway, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    received = time.perf_counter()
    served: ServedDeployment | None = None
    try:
        gateway.identify_caller(request)  # 1
        body = parse_json_object(await read_body(request, gateway.config.max_body_bytes,  # 2
                                                 [s.router for s in gateway.served()]))
        served = gateway.deployment_for(body)  # 3
        tenant = identify(gateway, served, request)
        parse = parse_chat if endpoint is Endpoint.CHAT else parse_completion  # 4
        gen = parse(body, served.model, served.sampling_defaults)
        ticket = served.tenants.admit(tenant, body, gen.worker_body, caller=gen.user or request.remote or "")
        if served.itl_objective_s is not None:
            gen.worker_body["itl_target_s"] = served.itl_objective_s
    except ApiError as error:
        # The codes are a fixed set (invalid_json, invalid_type, model_not_found, ...): a bounded label.
        gateway.count_refusal(served, error.code or "invalid_request")
        return error_response(error)
    trace = served.trace.begin(gen.worker_body, ticket.tenant, ticket.priority_class, received)
    response = None
    try:
        response = await serve(gateway.config, served, request, gen, received, ticket, trace)
        return response
    finally:
        ticket.release()  # the tenant's concurrency slot, and its tokens counted from the real usage
        served.trace.end(trace, response)


async def serve(config: Config, served: ServedDeployment, request: web.Request, gen: GenerationRequest,
                received: float, ticket: Ticket, trace: TraceEntry | None = None) -> web.StreamResponse:
    """Steps 5 to 8 of an admitted request."""
    metrics, preemption = served.metrics, served.preemption
    try:
        # The header wins over the body's `user`: a client can pin its variant without touching its requests.
        group = await served.router.pick_group_probed(request.headers.get(VARIANT_KEY_HEADER) or gen.user)  # 5
    except ApiError as error:
        metrics.count_error(error.code or "gateway")
        return error_response(error)
    series = metrics.requests(revision="" if group.revision is None else str(group.revision))
    headers = group_headers(group)
    too_long = prompt_too_long(gen.worker_body, group.max_prompt_chars())
    if too_long is not None:
        series.count_error(too_long.code)
        return error_response(too_long, headers)
    try:
        # A slot among the requests that may run at once; waits in the admission queue when none is free.
        ticket.slot = await served.admission.acquire(ticket.tenant, ticket.priority_class)  # 6
    except ApiError as error:
        series.count_error(error.code)
        return error_response(error, headers)
    request_id = ("chatcmpl-" if gen.endpoint is Endpoint.CHAT else "cmpl-") + uuid.uuid4().hex
    deadline = asyncio.get_running_loop().time() + config.request_timeout
    served.num_running += 1
    # The request may be preempted for a waiting one that outranks it (preemption.py), before or after its first
    # token; either way it goes back to the queue and later resumes where it stopped.
    preemptible = preemption.attach(ticket, gen.worker_body.get("max_tokens"))
    try:
        try:  # 7
            async with asyncio.timeout_at(deadline):
                try:
                    stream = await preemption.start(preemptible, functools.partial(
                        _start, served, group, request_id, gen.worker_body, ticket))
                except ApiError as error:
                    fallback = served.router.fallback_group(group) if error.status >= 500 else None
                    if fallback is None:
                        raise
                    # A canary failed it before the first token: the failure counts against the canary (its
                    # series feeds the rollout's analysis), and the client gets one try on stable instead.
                    series.count_error(error.code or "gateway")
                    metrics.count_retry("canary_failed")
                    log.info("request %s failed on canary revision %s (%s): one more try on stable revision %s",
                             request_id, group.revision, error.message, fallback.revision)
                    group = fallback
                    series = metrics.requests(revision=str(group.revision))
                    headers = group_headers(group)
                    stream = await preemption.start(preemptible, functools.partial(
                        _start, served, group, f"{request_id}-stable", gen.worker_body, ticket))
        except ApiError as error:
            series.count_error(error.code or "gateway")
            return error_response(error, headers)
        except WorkerRejected as rejected:
            series.count_error("worker_rejected")
            return web.Response(status=rejected.status, body=rejected.body, headers={
                "Content-Type": rejected.content_type or "application/json", **rejected.headers, **headers})
        except TimeoutError:
            series.count_error("timeout")
            return error_response(timed_out(config, "no first token"), headers)
        ticket.stream = stream
        ticket.slot.charge(prompt_tokens=stream.prompt_tokens)
        answer = Served(series, headers, received, deadline, ticket, trace)
        try:  # 8
            if gen.stream:
                return await _stream(config, served.model, request, gen, stream, request_id, answer)
            return await _collect(config, served.model, gen, stream, request_id, answer)
        finally:
            await stream.close()
    finally:
        preemption.detach(preemptible)
        served.num_running -= 1


def _start(served: ServedDeployment, group: Group, request_id: str, body: dict, ticket: Ticket,
           num_preemptions: int) -> Awaitable[TokenStream]:
    # A try after a preemption gets a worker request id of its own: the worker may not have dropped the last one.
    # Once a worker holds it, a request preempted for its slot may close its own leg (Admission.hand_over).
    return served.relay.start(group, f"{request_id}-p{num_preemptions}" if num_preemptions else request_id, body,
                              accepted=ticket.slot.handed_over)


def timed_out(config: Config, what: str) -> ApiError:
    return ApiError(504, f"{what} within --request-timeout {config.request_timeout}s", type="timeout_error",
                    code="timeout")


async def _collect(config: Config, model: str, gen: GenerationRequest, stream: TokenStream, request_id: str,
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
        return error_response(timed_out(config, "the request did not finish"), served.headers)
    except StreamBroken as exc:
        served.series.count_error(exc.kind)
        return error_response(ApiError(502, f"the request failed after it started: {exc.message}",
                                       type="upstream_error", code=exc.kind), served.headers)
    served.observe_finish(stream)
    finish = stream.finish
    return web.json_response(completion_response(
        gen.endpoint, request_id, int(time.time()), model, "".join(texts), finish.reason,
        finish.prompt_tokens, finish.completion_tokens), headers=served.headers)


async def _stream(config: Config, model: str, request: web.Request, gen: GenerationRequest, stream: TokenStream,
                  request_id: str, served: Served) -> web.StreamResponse:
    # The revision headers go on the response head: a streaming client reads them before the first chunk.
    response = web.StreamResponse(headers={**SSE_HEADERS, **served.headers})
    encoder = ChunkEncoder(gen.endpoint, request_id, int(time.time()), model, gen.include_usage)
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
                exc = StreamBroken("timeout", f"the request ran past --request-timeout {config.request_timeout}s")
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
        # request at once must find them free (stream.close is idempotent; serve's finally calls it again).
        await stream.close()
        served.ticket.release()
        await response.write_eof(tail + SSE_DONE)
        served.observe_finish(stream)
    except ConnectionResetError:
        # The client went away; closing the stream (in generate) aborts the request on the worker.
        served.series.count_error("client_disconnected")
    return response
