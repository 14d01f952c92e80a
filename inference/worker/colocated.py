"""Colocated role: `POST /v1/generate` runs prefill and decode in this process and streams NDJSON."""
from __future__ import annotations

import time

from aiohttp import web

from inference.worker.jobs import stream_job
from inference.worker.seams import RoleHost


def add_routes(app: web.Application, host: RoleHost) -> None:
    async def generate(request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        req, prompt_ids = await host.read_generate(request, need_decode_url=False)
        job = host.open_job(req.request_id, arrival)
        try:
            host.submit(job, prompt_ids + req.resume_token_ids, req.params, req.stop,
                        num_resumed_tokens=len(req.resume_token_ids), cache_salt=req.cache_salt,
                        priority=req.priority, itl_target_s=req.itl_target_s)
            await job.wait_admitted()
            return await stream_job(request, job)
        finally:
            # Normal end, client gone (CancelledError / ConnectionResetError) or error: the engine frees its blocks.
            host.close_job(job)

    app.router.add_post("/v1/generate", generate)
