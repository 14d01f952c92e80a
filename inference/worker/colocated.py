"""Colocated role: `POST /v1/generate` runs prefill and decode in this process and streams NDJSON."""
from __future__ import annotations

import time

from aiohttp import web

from inference.worker.jobs import stream_job
from inference.worker.protocol import parse_generate, parse_json


def add_routes(app: web.Application, server) -> None:
    """`server` is the WorkerServer: admission, body limits, tokenizer, and the jobs it opens and closes."""

    async def generate(request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        server.check_test_fault()
        server.check_admission()
        req = parse_generate(parse_json(await server.read_body(request, server.config.max_body_bytes)),
                             need_decode_url=False)
        prompt_ids = await server.tokenize(req.prompt, req.messages)
        req.fit_to_context(len(prompt_ids), server.info, server.vocab_size)
        job = server.open_job(req.request_id, arrival)
        try:
            server.submit(job, prompt_ids + req.resume_token_ids, req.params, req.stop,
                          num_resumed_tokens=len(req.resume_token_ids))
            await job.wait_admitted()
            return await stream_job(request, job)
        finally:
            # Normal end, client gone (CancelledError / ConnectionResetError) or error: the engine frees its blocks.
            server.close_job(job)

    app.router.add_post("/v1/generate", generate)
