"""Decode role: `POST /v1/kv` receives a prefilled request, `GET /v1/stream/{request_id}` streams its tokens.

A received request joins the engine at once (it waits there for KV blocks, never fails for lack of them) and its
events are buffered until the gateway connects; one nobody streams within --stream-claim-timeout is aborted.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import partial

from aiohttp import web

from inference.checks import is_int
from inference.kv_wire import KVWireError, decode_payload
from inference.worker.jobs import stream_job
from inference.worker.protocol import (REQUEST_ID_RE, RequestError, check_logit_bias, fit_max_tokens,
                                      parse_sampling)

# Bytes of a KV payload beyond its tensors: the JSON header (prompt ids as decimal text) and safetensors framing.
HEADER_BYTES_PER_TOKEN = 16
HEADER_SLACK_BYTES = 1 << 20


def kv_body_limit(info: dict) -> int:
    """The largest payload a request that fits this model can need: a bigger body is refused before it is read.

    Counted at 4 bytes an element whatever this worker's dtype, so that a payload from a prefill worker of a wider
    dtype reaches the header check and its 400 that names both dtypes, not a bare 413."""
    layout = info["kv_layout"]
    itemsize = 4  # the widest dtype a worker runs (float32)
    per_token = 2 * layout["num_layers"] * layout["num_kv_heads"] * layout["head_dim"] * itemsize
    return info["max_model_len"] * (per_token + HEADER_BYTES_PER_TOKEN) + HEADER_SLACK_BYTES


def add_routes(app: web.Application, server) -> None:
    """`server` is the WorkerServer: admission, body limits, and the jobs it opens and closes."""
    async def receive_kv(request: web.Request) -> web.Response:
        arrival = time.monotonic()
        server.check_test_fault()
        server.check_admission()
        body = await server.read_body(request, kv_body_limit(server.info))
        try:
            payload = await asyncio.get_running_loop().run_in_executor(None, partial(
                decode_payload, body, kv_layout=server.info["kv_layout"], revision=server.config.revision))
        except KVWireError as exc:
            raise RequestError(f"bad KV payload: {exc}", code="bad_kv_payload") from None
        if not REQUEST_ID_RE.match(payload.request_id):
            raise RequestError("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="request_id")
        params, stop = parse_sampling(payload.sampling)
        # A resumed request's prompt_token_ids end with the tokens it generated before (docs/contracts.md).
        num_resumed = payload.extra.get("num_resumed_tokens", 0)
        if not is_int(num_resumed) or not 0 <= num_resumed < len(payload.prompt_token_ids) \
                or num_resumed >= params.max_tokens:
            raise RequestError("header field 'num_resumed_tokens' must be an integer >= 0, below the number of "
                               "prompt_token_ids and below max_tokens", code="bad_kv_payload")
        num_prompt_tokens = len(payload.prompt_token_ids) - num_resumed
        params = replace(params, max_tokens=fit_max_tokens(num_prompt_tokens, params.max_tokens, server.info))
        if num_resumed >= params.max_tokens:  # only where the prefill worker's pool held more than this one's
            raise RequestError(f"the {num_resumed} resumed tokens fill this worker's context of "
                               f"{server.info['max_model_len']} tokens", code="context_length_exceeded")
        bad = [t for t in (*payload.prompt_token_ids, payload.first_token_id) if t >= server.vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside this model's vocabulary of {server.vocab_size}",
                               code="bad_kv_payload")
        check_logit_bias(params, server.vocab_size)
        job = server.open_job(payload.request_id, arrival)
        try:
            server.submit(job, payload.prompt_token_ids, params, stop, first_token_id=payload.first_token_id,
                          kv=(payload.k, payload.v), num_resumed_tokens=num_resumed)
            del payload  # the engine thread holds the tensors now
            await job.wait_admitted()
        except BaseException:
            server.close_job(job)
            raise
        job.accepted = True
        job.start_claim_timer(server.config.stream_claim_timeout, partial(server.close_job, job, kind="timeout"))
        server.metrics.kv_transfer_bytes.inc(len(body))
        server.metrics.kv_transfer_seconds.observe(time.monotonic() - arrival)
        return web.json_response({"request_id": job.request_id, "accepted": True,
                                  "prompt_tokens": num_prompt_tokens})

    async def stream(request: web.Request) -> web.StreamResponse:
        request_id = request.match_info["request_id"]
        server.check_test_fault()
        job = server.jobs.get(request_id)
        if job is None or not job.accepted:
            raise RequestError(f"no request {request_id!r} on this worker (never received, finished, or not "
                               "streamed in time)", status=404, param="request_id", code="unknown_request")
        if job.claimed:
            raise RequestError(f"request {request_id!r} is already being streamed", status=409,
                               param="request_id", code="already_streaming")
        job.claimed = True
        job.cancel_claim_timer()
        try:
            return await stream_job(request, job)
        finally:
            server.close_job(job)

    app.router.add_post("/v1/kv", receive_kv)
    app.router.add_get("/v1/stream/{request_id}", stream)
