"""Decode role: `POST /v1/kv` receives a prefilled request, `GET /v1/stream/{request_id}` streams its tokens.

A received request joins the engine at once (it waits there for KV blocks, never fails for lack of them) and its
events are buffered until the gateway connects; one nobody streams within --stream-claim-timeout is aborted.
"""
from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

from aiohttp import web

from inference.checks import is_int
from inference.kv_checksum import ChecksumMismatch
from inference.worker.jobs import stream_job
from inference.worker.protocol import (REQUEST_ID_RE, RequestError, check_logit_bias, fit_max_tokens,
                                      parse_sampling, parse_scheduling)
from inference.worker.seams import RoleHost


def add_routes(app: web.Application, host: RoleHost) -> None:
    async def receive_kv(request: web.Request) -> web.Response:
        arrival = time.monotonic()
        # The limit is the loaded model's: worked out once the request is admitted (a worker still loading has
        # no KV layout yet, and answers 503 starting).
        body = await host.read_body(request, host.kv.body_limit)
        try:
            header, kv = await host.kv.decode(body, kv_layout=host.info["kv_layout"], revision=host.config.revision)
        except ValueError as exc:  # the codec's own error: what is wrong with the payload, for the sender
            # A corrupted push has its own code: the sender pushes it once more (prefill.push_kv).
            code = "kv_checksum_mismatch" if isinstance(exc, ChecksumMismatch) else "bad_kv_payload"
            raise RequestError(f"bad KV payload: {exc}", code=code) from None
        request_id, prompt_token_ids, first_token_id = (header["request_id"], header["prompt_token_ids"],
                                                        header["first_token_id"])
        if not REQUEST_ID_RE.match(request_id):
            raise RequestError("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="request_id")
        params, stop = parse_sampling(header["sampling"])
        priority, cache_salt, itl_target_s = parse_scheduling(header.get("scheduling"))
        # A resumed request's prompt_token_ids end with the tokens it generated before (docs/contracts.md).
        num_resumed = header.get("num_resumed_tokens", 0)
        if not is_int(num_resumed) or not 0 <= num_resumed < len(prompt_token_ids) \
                or num_resumed >= params.max_tokens:
            raise RequestError("header field 'num_resumed_tokens' must be an integer >= 0, below the number of "
                               "prompt_token_ids and below max_tokens", code="bad_kv_payload")
        num_prompt_tokens = len(prompt_token_ids) - num_resumed
        params = replace(params, max_tokens=fit_max_tokens(num_prompt_tokens, params.max_tokens, host.info))
        if num_resumed >= params.max_tokens:  # only where the prefill worker's pool held more than this one's
            raise RequestError(f"the {num_resumed} resumed tokens fill this worker's context of "
                               f"{host.info['max_model_len']} tokens", code="context_length_exceeded")
        bad = [t for t in (*prompt_token_ids, first_token_id) if t >= host.vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside this model's vocabulary of {host.vocab_size}",
                               code="bad_kv_payload")
        check_logit_bias(params, host.vocab_size)
        job = host.open_job(request_id, arrival)
        try:
            host.submit(job, prompt_token_ids, params, stop, first_token_id=first_token_id, kv=kv,
                        num_resumed_tokens=num_resumed, cache_salt=cache_salt, priority=priority,
                        itl_target_s=itl_target_s)
            del kv  # the engine holds the tensors now
            await job.wait_admitted()
        except BaseException:
            host.close_job(job)
            raise
        job.accepted = True
        job.start_claim_timer(host.config.stream_claim_timeout, partial(host.close_job, job, kind="timeout"))
        host.metrics.kv_transfer_bytes.inc(len(body))
        host.metrics.kv_transfer_seconds.observe(time.monotonic() - arrival)
        return web.json_response({"request_id": job.request_id, "accepted": True,
                                  "prompt_tokens": num_prompt_tokens})

    async def stream(request: web.Request) -> web.StreamResponse:
        request_id = request.match_info["request_id"]
        job = host.find_job(request_id)
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
            host.close_job(job)

    app.router.add_post("/v1/kv", receive_kv)
    app.router.add_get("/v1/stream/{request_id}", stream)
