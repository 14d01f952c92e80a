"""The gateway's routes that describe the fleet behind it: /health, /metrics, /trace and the serving part of
/v1/models.

They say more than a client should learn: /metrics names every tenant with its usage and limits, /health and
/v1/models list the workers' addresses. Where the gateway holds a scrape token (config.SCRAPE_TOKEN_ENV, which the
node agent gives every gateway it starts: docs/gateway.md "Operator routes"), they answer in full only to a request
that carries it (`Authorization: Bearer <token>`): the control plane's scraper and health checks, and a Prometheus whose
scrape job sends it. Anyone else gets what a client needs: /health a bare liveness answer (its status code and
`status`), /v1/models the OpenAI list with the model's context and sampling defaults, /metrics a 401 saying where the
token comes from. A gateway started by hand without a token answers everyone in full, as before.
"""
from __future__ import annotations

import hmac
from typing import Protocol

from aiohttp import web

from inference.gateway.config import Config
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.openai_protocol import ApiError
from inference.gateway.routing import Router
from inference.gateway.trace_log import MAX_PAGE, TraceLog
from inference.metrics import CONTENT_TYPE


class Gateway(Protocol):
    """What these routes read of the gateway (app.Gateway)."""

    config: Config
    router: Router
    metrics: GatewayMetrics
    model: str
    created: int
    sampling_defaults: dict
    num_running: int
    trace: TraceLog


def is_operator(request: web.Request, token: str | None) -> bool:
    """Whether the request may see the fleet: no token is configured, or it sends this one (constant time)."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                               token.encode())


async def health(gateway: Gateway, request: web.Request) -> web.Response:
    full = is_operator(request, gateway.config.scrape_token)
    groups = [g.describe() for g in gateway.router.groups]
    try:
        group = gateway.router.serving_group()
    except ApiError:
        if not full:
            return web.json_response({"status": "unavailable"}, status=503)
        return web.json_response({"status": "unavailable", "reason": gateway.router.unavailable_reason(),
                                  "groups": groups}, status=503)
    if not full:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "ok", "revision": group.revision, "mode": group.mode.value, "groups": groups})


async def metrics(gateway: Gateway, request: web.Request) -> web.Response:
    if not is_operator(request, gateway.config.scrape_token):
        return _token_required("/metrics", "the control plane and Prometheus")
    gateway.metrics.requests_running.set(gateway.num_running)
    return web.Response(body=gateway.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def trace(gateway: Gateway, request: web.Request) -> web.Response:
    """GET /trace?after=SEQ&limit=N: the request records after SEQ (trace_log.py), for the control plane."""
    if not is_operator(request, gateway.config.scrape_token):
        return _token_required("/trace", "the control plane")
    try:
        after = int(request.query.get("after", "0"))
        limit = int(request.query.get("limit", str(MAX_PAGE)))
    except ValueError:
        error = ApiError(400, "after and limit must be integers", param="after", code="invalid_value")
        return web.json_response(error.body(), status=error.status)
    return web.json_response(gateway.trace.page(after, limit))


def _token_required(route: str, readers: str) -> web.Response:
    error = ApiError(401, f"this gateway's {route} is for {readers}: send 'Authorization: Bearer <scrape token>' "
                          "(an operator reads it at GET /api/v1/prometheus/scrape-token)",
                     type="authentication_error", code="scrape_token_required")
    return web.json_response(error.body(), status=error.status)


def models(gateway: Gateway, request: web.Request) -> web.Response:
    """OpenAI's model list, plus what serves the model: `dtype`, the one dtype of the serving group's ready workers
    (None while there is no serving group, or while its workers disagree, which the KV handoff refuses);
    `max_model_len`, the context every ready serving worker holds (the smallest of theirs): a longer request
    finishes with "length"; `sampling_defaults`, what the gateway fills into a request that leaves a field out; and,
    to an operator (above), `workers`: each listed worker with its routing weight and the dtype it runs (from its
    health probe). A deployment that requires a key lists its model to a valid key only (the caller checks)."""
    try:
        serving = gateway.router.serving_group()
        ready = [w for role in serving.roles for w in serving.workers(role) if w.is_ready]
    except ApiError:
        ready = []
    dtypes = {w.dtype for w in ready}
    lens = [w.max_model_len for w in ready if w.max_model_len is not None]
    model = {"id": gateway.model, "object": "model", "created": gateway.created, "owned_by": "tandem",
             "dtype": dtypes.pop() if len(dtypes) == 1 else None, "max_model_len": min(lens) if lens else None,
             "sampling_defaults": dict(gateway.sampling_defaults)}
    if is_operator(request, gateway.config.scrape_token):
        model["workers"] = [{"role": w.role.value, "revision": group.revision, "url": w.url, "state": w.state.value,
                             "weight": w.weight, "dtype": w.dtype, "max_model_len": w.max_model_len}
                            for group in gateway.router.groups for role in group.roles for w in group.workers(role)]
    return web.json_response({"object": "list", "data": [model]})
