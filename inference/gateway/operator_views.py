"""The gateway's routes that describe the fleet behind it: /health, /metrics, /trace and the serving part of
/v1/models.

They say more than a client should learn: /metrics names every tenant with its usage and limits, /health and
/v1/models list the workers' addresses. Where the gateway holds a scrape token (config.SCRAPE_TOKEN_ENV, which the
node agent gives every gateway it starts: docs/gateway.md "Operator routes"), they answer in full only to a request
that carries it (`Authorization: Bearer <token>`): the control plane's scraper and health checks, and a Prometheus whose
scrape job sends it. Anyone else gets what a client needs: /health a bare liveness answer (its status code and
`status`), /v1/models the OpenAI list with the model's context and sampling defaults, /metrics a 401 saying where the
token comes from. A gateway started by hand without a token answers everyone in full, as before.

A shared gateway answers them for every deployment it serves: /health with each one's state, /metrics with each
one's series (labelled with its model; `?deployment=NAME`: that one's alone, without the process's own series, the page
Prometheus scrapes for that deployment's target), /trace with one deployment's records (`?deployment=NAME`),
/v1/models with the models the caller may use.
"""
from __future__ import annotations

import hmac
from typing import Protocol

from aiohttp import web
from prometheus_client.registry import CollectorRegistry

from inference.gateway import metrics as gateway_metrics
from inference.gateway.config import Config
from inference.gateway.deployment import ServedDeployment
from inference.gateway.openai_protocol import ApiError
from inference.gateway.trace_log import MAX_PAGE
from inference.metrics import CONTENT_TYPE


class Gateway(Protocol):
    """What these routes read of the gateway (app.Gateway)."""

    config: Config
    shared: bool
    created: int
    registry: CollectorRegistry  # a shared gateway's own series (the process's, refusals before a deployment)

    def served(self) -> list[ServedDeployment]: ...


def is_operator(request: web.Request, token: str | None) -> bool:
    """Whether the request may see the fleet: no token is configured, or it sends this one (constant time)."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                               token.encode())


def _health_of(served: ServedDeployment) -> tuple[bool, dict]:
    """Whether the deployment serves, and its full answer (its groups, and the serving one or why none serves)."""
    groups = [g.describe() for g in served.router.groups]
    try:
        group = served.router.serving_group()
    except ApiError:
        return False, {"status": "unavailable", "reason": served.router.unavailable_reason(), "groups": groups}
    return True, {"status": "ok", "revision": group.revision, "mode": group.mode.value, "groups": groups}


async def health(gateway: Gateway, request: web.Request) -> web.Response:
    """A per-deployment gateway: 200 while its deployment serves, else 503. A shared one: 200 `ok` while every
    deployment serves, 200 `degraded` while some do (the process serves them; taking it out of a load balancer
    would stop those too), 503 `unavailable` while none does; to an operator, each deployment's answer by name."""
    full = is_operator(request, gateway.config.scrape_token)
    answers = {served.name: _health_of(served) for served in gateway.served()}
    if not gateway.shared:
        ((ok, answer),) = answers.values()
        return web.json_response(answer if full else {"status": answer["status"]}, status=200 if ok else 503)
    num_ok = sum(ok for ok, _ in answers.values())
    status = "ok" if answers and num_ok == len(answers) else "degraded" if num_ok else "unavailable"
    body: dict = {"status": status}
    if full:
        body["deployments"] = {name: answer for name, (_, answer) in answers.items()}
    return web.json_response(body, status=503 if status == "unavailable" else 200)


async def metrics(gateway: Gateway, request: web.Request) -> web.Response:
    if not is_operator(request, gateway.config.scrape_token):
        return _token_required("/metrics", "the control plane and Prometheus")
    served = gateway.served()
    name = request.query.get("deployment")
    if name is not None:  # one deployment's series (Prometheus' target per deployment of a shared gateway)
        served = [s for s in served if s.name == name]
        if not served:
            return _bad_query(f"give ?deployment= one of the deployments served here, not {name!r}", "deployment")
    for one in served:
        one.metrics.requests_running.set(one.num_running)
    if not gateway.shared:
        page = served[0].metrics.render()
    elif name is not None:
        page = gateway_metrics.render([served[0].metrics.registry])
    else:
        page = gateway_metrics.render([gateway.registry, *(one.metrics.registry for one in served)])
    return web.Response(body=page, headers={"Content-Type": CONTENT_TYPE})


def trace(gateway: Gateway, request: web.Request) -> web.Response:
    """GET /trace?after=SEQ&limit=N[&deployment=NAME]: the request records after SEQ (trace_log.py), for the control
    plane; a shared gateway's of the deployment it names (each has its own sequence)."""
    if not is_operator(request, gateway.config.scrape_token):
        return _token_required("/trace", "the control plane")
    try:
        after = int(request.query.get("after", "0"))
        limit = int(request.query.get("limit", str(MAX_PAGE)))
    except ValueError:
        return _bad_query("after and limit must be integers", "after")
    served = gateway.served()
    name = request.query.get("deployment")
    if name is not None or gateway.shared:
        served = [s for s in served if s.name == name]
        if not served:
            return _bad_query(f"give ?deployment= one of the deployments served here, not {name!r}", "deployment")
    return web.json_response(served[0].trace.page(after, limit))


def _bad_query(message: str, param: str) -> web.Response:
    error = ApiError(400, message, param=param, code="invalid_value")
    return web.json_response(error.body(), status=error.status)


def _token_required(route: str, readers: str) -> web.Response:
    error = ApiError(401, f"this gateway's {route} is for {readers}: send 'Authorization: Bearer <scrape token>' "
                          "(an operator reads it at GET /api/v1/prometheus/scrape-token)",
                     type="authentication_error", code="scrape_token_required")
    return web.json_response(error.body(), status=error.status)


def models(gateway: Gateway, visible: list[ServedDeployment], request: web.Request) -> web.Response:
    """OpenAI's model list of the `visible` deployments (those the caller may use: the gateway checks), each with
    what serves it: `dtype`, the one dtype of the serving group's ready workers (None while there is no serving group,
    or while its workers disagree, which the KV handoff refuses); `max_model_len`, the context every ready serving
    worker holds (the smallest of theirs): a longer request finishes with "length"; `sampling_defaults`, what the
    gateway fills into a request that leaves a field out; and, to an operator (above), `workers`: each listed worker
    with its routing weight and the dtype it runs (from its health probe)."""
    operator = is_operator(request, gateway.config.scrape_token)
    return web.json_response({"object": "list", "data": [_model(served, operator) for served in visible]})


def _model(served: ServedDeployment, operator: bool) -> dict:
    router = served.router
    try:
        serving = router.serving_group()
        ready = [w for role in serving.roles for w in serving.workers(role) if w.is_ready]
    except ApiError:
        ready = []
    dtypes = {w.dtype for w in ready}
    lens = [w.max_model_len for w in ready if w.max_model_len is not None]
    model = {"id": served.model, "object": "model", "created": served.created, "owned_by": "tandem",
             "dtype": dtypes.pop() if len(dtypes) == 1 else None, "max_model_len": min(lens) if lens else None,
             "sampling_defaults": dict(served.sampling_defaults)}
    if operator:
        model["workers"] = [{"role": w.role.value, "revision": group.revision, "url": w.url, "state": w.state.value,
                             "weight": w.weight, "dtype": w.dtype, "max_model_len": w.max_model_len}
                            for group in router.groups for role in group.roles for w in group.workers(role)]
    return model
