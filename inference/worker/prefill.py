"""Prefill role: `POST /v1/prefill` prefills the prompt, samples the first token and pushes the KV to decode_url.

It answers only after the decode worker accepted the payload, so a 200 means the request lives on there; a push that
fails answers 502 (decode_unreachable / decode_full / decode_rejected) so that the gateway can retry on another decode worker.
A push the decode worker refuses as corrupted in flight (its checksum: `kv_checksum_mismatch`) is pushed once more
first: the prefill worker still holds the KV, and a fault on the path should not cost the request its decode worker.
"""
from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from inference.worker.protocol import RequestError
from inference.worker.seams import RoleHost
from inference.worker_secret import SECRET_HEADER

KV_CONTENT_TYPE = "application/octet-stream"
NUM_PUSHES = 2  # a push refused as corrupted in flight is pushed once more before the gateway is told
CORRUPTED = "kv_checksum_mismatch"  # the decode worker's code for it (decode.py)


def add_routes(app: web.Application, host: RoleHost) -> None:
    async def client_session(app: web.Application):
        # One pooled session for all pushes; per-push timeouts are set on each call.
        app["kv_session"] = aiohttp.ClientSession()
        yield
        await app["kv_session"].close()

    app.cleanup_ctx.append(client_session)

    async def prefill(request: web.Request) -> web.Response:
        arrival = time.monotonic()
        req, prompt_ids = await host.read_generate(request, need_decode_url=True)
        num_resumed = len(req.resume_token_ids)
        job = host.open_job(req.request_id, arrival)
        try:
            host.submit(job, prompt_ids + req.resume_token_ids, req.params, req.stop, num_resumed_tokens=num_resumed,
                        cache_salt=req.cache_salt, priority=req.priority, itl_target_s=req.itl_target_s)
            await job.wait_admitted()
            event = await job.next_event()
            if event.type != "token":
                raise RequestError(f"prefill failed: {event.message}", status=503, type="engine_error",
                                   code=event.kind or "engine", kind=event.kind or "engine", counted=True)
            # No token: a resumed request whose earlier tokens already end it.
            first_token_id = event.token_ids[0] if event.token_ids else None
            answer = {"request_id": job.request_id, "prompt_tokens": len(prompt_ids),
                      "first_token_id": first_token_id, "text": event.text,
                      "finished": event.finish_reason is not None, "finish_reason": event.finish_reason,
                      "kv_bytes": 0, "kv_transfer_seconds": 0.0}
            if host.config.simulated:
                answer["simulated"] = True
            if event.finish_reason is None:
                # The KV covers the resumed tokens too; the header says how many of them the prompt's end holds.
                # The payload carries the decode worker's KV dtype when the gateway named it (its /health), and
                # encoding converts the tensors to it: stages may run different dtypes (issue: precision by stage).
                layout = dict(host.info["kv_layout"])
                if req.decode_kv_dtype and not host.config.simulated:
                    layout["dtype"] = req.decode_kv_dtype
                header = {"request_id": job.request_id, "prompt_token_ids": prompt_ids + req.resume_token_ids,
                          "first_token_id": first_token_id, "sampling": req.sampling_header(),
                          "scheduling": req.scheduling_header(),
                          "kv_layout": layout, "revision": host.config.revision}
                if num_resumed:
                    header["num_resumed_tokens"] = num_resumed
                answer["kv_bytes"], answer["kv_transfer_seconds"] = await push_kv(
                    request.app["kv_session"], req.decode_url, header, event.kv, host)
                host.metrics.count_success("handoff")
                host.metrics.e2e_request_latency.observe(time.monotonic() - arrival)
            return web.json_response(answer)
        finally:
            host.close_job(job)

    app.router.add_post("/v1/prefill", prefill)


async def push_kv(session: aiohttp.ClientSession, decode_url: str, header: dict, kv: tuple,
                  host: RoleHost) -> tuple[int, float]:
    """Serialize (host.kv) and POST to decode_url/v1/kv, once more if it arrived corrupted; return (bytes, seconds)
    or raise a 502."""
    started = time.monotonic()
    data = await host.kv.encode(header, kv)
    url = f"{decode_url}/v1/kv"
    timeout = aiohttp.ClientTimeout(total=host.config.kv_push_timeout)
    headers = {"Content-Type": KV_CONTENT_TYPE}
    if host.config.secret is not None:
        # A decode worker of this request's revision (decode refuses another's KV layout) holds the same secret.
        headers[SECRET_HEADER] = host.config.secret
    for attempt in range(NUM_PUSHES):
        try:
            async with session.post(url, data=data, headers=headers, timeout=timeout) as r:
                if r.status == 200:
                    break
                code, detail = await _error_of(r)
                if code == CORRUPTED and attempt + 1 < NUM_PUSHES:
                    continue
                # A full decode worker is backpressure, a refused payload a failure: the gateway answers 429 or 502.
                raise RequestError(f"decode worker {decode_url} refused the KV cache: HTTP {r.status}: {detail}",
                                   status=502, type="kv_transfer_error",
                                   code="decode_full" if r.status == 429 else "decode_rejected")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RequestError(f"decode worker {decode_url} unreachable: {exc!r}", status=502,
                               type="kv_transfer_error", code="decode_unreachable") from None
    seconds = time.monotonic() - started
    host.metrics.kv_transfer_bytes.inc(len(data))
    host.metrics.kv_transfer_seconds.observe(seconds)
    return len(data), seconds


async def _error_of(response: aiohttp.ClientResponse) -> tuple[str | None, str]:
    """(code, message) of an error answer."""
    try:
        body = await response.json(content_type=None)
        return body["error"].get("code"), str(body["error"]["message"])
    except Exception:  # not our error shape: show the start of whatever it was
        return None, (await response.text(errors="replace"))[:300]
