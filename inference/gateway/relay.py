"""Talking to workers: the colocated and disaggregated paths, and the one retry before the first token.

`Relay.start` returns only once the request's first token is in hand (or it finished without one), so that
everything that can still be retried or answered with a clean HTTP status happens before the client sees a byte.
After that, `TokenStream.deltas` relays the rest; when the worker streaming it dies, the stream moves the request to
another worker pair of the same revision through `Relay._resume` (token_stream.py). Before the first token, an attempt
whose prefill or decode worker the router takes out of rotation (a hung or partitioned worker) fails at once and is
retried, rather than waiting out the KV push's timeout.

Which failures take a worker out of rotation: only a connection that fails (refused, reset, timed out) or, through
the router's probes, a failed /health. A worker's error answer to one request (a 5xx, an error event) excludes it
from that request's retry only: one bad request must not lock everyone else out of a healthy worker.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine

import aiohttp

from inference import ndjson
from inference.engines import VLLM
from inference.engines.vllm import protocol as vllm_protocol
from inference.gateway.config import Config
from inference.gateway.openai_protocol import ApiError
from inference.gateway.routing import Group, Plan, Router, Worker, overloaded
from inference.gateway.token_stream import TRANSPORT_ERRORS, Finish, Leg, StreamBroken, TokenStream
from inference.worker_secret import SECRET_HEADER, revision_secret

log = logging.getLogger("tandem.gateway.relay")

JSON_HEADERS = {"Content-Type": "application/json"}
NUM_ATTEMPTS = 2  # the first try and one retry on another worker


class WorkerRejected(Exception):
    """A worker's own 4xx answer (a context overflow, say): relayed to the client unchanged."""

    def __init__(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.content_type, self.headers = status, body, content_type, headers


class AttemptFailed(Exception):
    """One try failed before the first token; another worker may succeed."""

    def __init__(self, kind: str, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.retry_after = kind, message, retry_after


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    try:
        return (await resp.text())[:300]
    except TRANSPORT_ERRORS:
        return ""


class Relay:
    def __init__(self, config: Config, router: Router, session: aiohttp.ClientSession, on_retry=None,
                 on_migration=None, *, model: str | None = None, worker_key: str | None = None) -> None:
        self.config = config
        self.router = router
        self.session = session
        # The deployment's (a shared gateway relays for several): the model a vLLM worker is asked for, and the key
        # each revision's worker secret derives from.
        self.model = model or config.served_model_name
        self.worker_key = worker_key or config.worker_key
        self.on_retry = on_retry or (lambda kind: None)
        self.on_migration = on_migration or (lambda reason: None)

    async def start(self, group: Group, request_id: str, body: dict,
                    accepted: Callable[[], None] | None = None) -> TokenStream:
        """Run the request up to its first token in `group` (the router's `pick_group`); the stream it returns may
        move the request inside that group's revision later. `accepted` is called once a worker holds the request
        (its colocated worker answered 200; its prefill pushed the KV to its decode worker)."""
        leg = await self._first_leg(group, request_id, body, set(), accepted)

        async def resume(token_ids: list[int], avoid: set[str], number: int) -> Leg:
            return await self._resume(group.revision, f"{request_id}-m{number}", body, token_ids, avoid)
        return TokenStream(leg, resume=resume, max_migrations=self.config.max_migrations,
                           on_migration=self.on_migration)

    async def _resume(self, revision: int | None, request_id: str, body: dict, token_ids: list[int],
                      avoid: set[str]) -> Leg:
        """A new leg for a request whose worker died after it relayed `token_ids`: the same body plus those tokens,
        on ready workers of the same revision other than `avoid`; StreamBroken when there are none or they fail."""
        group = self.router.complete_group(revision)
        if group is None:
            raise StreamBroken("no_ready_workers", f"no ready worker pair of revision {revision} is left")
        try:
            return await self._first_leg(group, request_id, {**body, "resume_token_ids": token_ids}, avoid)
        except ApiError as exc:
            raise StreamBroken(exc.code or "upstream_error", exc.message) from None
        except WorkerRejected as exc:
            raise StreamBroken("worker_rejected", f"a worker refused to continue it: HTTP {exc.status} "
                                                  f"{exc.body[:300].decode(errors='replace')}") from None

    async def _first_leg(self, group: Group, request_id: str, body: dict, excluded: set[str],
                         accepted: Callable[[], None] | None = None) -> Leg:
        """Run the request up to its first token, retrying once on another worker.

        1. Try the path of the group's mode; a failure before the first token excludes the worker that failed.
        2. Retry once inside the same group; if that fails too, answer the last failure.
        """
        failure: AttemptFailed | None = None
        for attempt in range(NUM_ATTEMPTS):
            attempt_id = request_id if attempt == 0 else f"{request_id}-retry{attempt}"
            try:
                plan = self.router.plan(group, body, excluded)
                if plan.decode is not None:
                    return await self._start_disaggregated(group, plan, attempt_id, body, excluded, accepted)
                return await self._start_colocated(group, plan.first, attempt_id, body, excluded, accepted)
            except AttemptFailed as exc:
                failure = exc
                log.info("request %s attempt %d failed (%s): %s", request_id, attempt + 1, exc.kind, exc.message)
                if attempt + 1 < NUM_ATTEMPTS:
                    self.on_retry(exc.kind)
            except ApiError:
                # No worker left to retry on: answer the failure that made us retry, not "no worker".
                if failure is None:
                    raise
                break
        assert failure is not None
        if failure.kind == "overloaded":
            raise overloaded(failure.message, failure.retry_after or "1")
        raise ApiError(502, f"the request failed on the workers: {failure.message}", type="upstream_error",
                       code=failure.kind)

    def _headers(self, group: Group) -> dict[str, str]:
        """What every request to a worker of `group` carries: its revision's worker secret, where the gateway has
        the deployment's key (inference.worker_secret), so that during a rollout each revision gets its own. A vLLM
        worker takes it as its API key."""
        secret = None if self.worker_key is None else revision_secret(self.worker_key, group.revision)
        if group.engine == VLLM:
            return vllm_protocol.auth_headers(secret)
        return JSON_HEADERS if secret is None else {**JSON_HEADERS, SECRET_HEADER: secret}

    def _acquire(self, worker: Worker):
        worker.num_outstanding += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                worker.num_outstanding -= 1
        return release

    async def _classify(self, resp: aiohttp.ClientResponse, worker: Worker, excluded: set[str]) -> None:
        """Turn a non-200 worker answer into WorkerRejected (relayed) or AttemptFailed (retried)."""
        if resp.status == 429:
            excluded.add(worker.url)
            raise AttemptFailed("overloaded", f"{worker.role.value} worker {worker.url} is full",
                                resp.headers.get("Retry-After", "1"))
        if resp.status in (401, 403):
            # The worker refused this gateway's worker secret: a deployment misconfigured, not the client's fault
            # (a 401 relayed would tell an OpenAI client that its own key is wrong).
            excluded.add(worker.url)
            raise AttemptFailed("worker_auth", f"{worker.role.value} worker {worker.url} refused the gateway's "
                                               f"worker secret: HTTP {resp.status} {await _error_text(resp)}")
        if 400 <= resp.status < 500:
            headers = {"Retry-After": resp.headers["Retry-After"]} if "Retry-After" in resp.headers else {}
            raise WorkerRejected(resp.status, await resp.read(), resp.content_type, headers)
        # The worker answered, so it is up: this request failed there, and another worker may take it (the
        # worker stays in rotation; /health decides whether it is sick).
        excluded.add(worker.url)
        reason = f"HTTP {resp.status} {await _error_text(resp)}"
        raise AttemptFailed("worker_error", f"{worker.role.value} worker {worker.url} answered {reason}")

    def _transport_failed(self, worker: Worker, excluded: set[str], exc: BaseException) -> AttemptFailed:
        excluded.add(worker.url)
        reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
        self.router.mark_down(worker, f"request failed: {reason}")
        return AttemptFailed("worker_unreachable", f"{worker.role.value} worker {worker.url}: {reason}")

    # -- colocated ----------------------------------------------------------------------------------------------------

    async def _start_colocated(self, group: Group, worker: Worker, request_id: str, body: dict, excluded: set[str],
                               accepted: Callable[[], None] | None = None) -> Leg:
        release = self._acquire(worker)
        resp = None
        try:
            if group.engine == VLLM:
                resp = await self._post_vllm(group, worker, body, excluded)
            else:
                payload = json.dumps({"request_id": request_id, **body}).encode()
                resp = await self.session.post(worker.url + "/v1/generate", data=payload,
                                               headers=self._headers(group))
            if resp.status != 200:
                await self._classify(resp, worker, excluded)
            if accepted is not None:
                accepted()
            if group.engine == VLLM:
                events = vllm_protocol.events(resp.content, num_resumed=len(body.get("resume_token_ids") or ()))
            else:
                events = ndjson.read(resp.content)
            prompt_tokens, pending, finish = await self._read_until_first_token(events, worker, excluded)
        except TRANSPORT_ERRORS as exc:
            release()
            if resp is not None:
                resp.close()
            raise self._transport_failed(worker, excluded, exc) from None
        except BaseException:
            release()
            if resp is not None:
                resp.close()
            raise
        return Leg(prompt_tokens, pending, finish, events if finish is None else None, [release], [resp], worker.url,
                   lambda reason: self.router.mark_down(worker, reason), worker.ejected)

    async def _post_vllm(self, group: Group, worker: Worker, body: dict,
                         excluded: set[str]) -> aiohttp.ClientResponse:
        """vLLM's streaming request for `body` (inference/engines/vllm/protocol.py); a resumed request's prompt is
        tokenized by the worker first."""
        headers, name = self._headers(group), self.model
        prompt_ids = max_model_len = None
        if body.get("resume_token_ids"):
            try:
                prompt_ids, max_model_len = await vllm_protocol.tokenize(self.session, worker.url, name, body,
                                                                         headers)
            except vllm_protocol.ResumeFailed as exc:
                excluded.add(worker.url)
                raise AttemptFailed("worker_error", str(exc)) from None
        path, payload = vllm_protocol.request_for(body, name, prompt_ids=prompt_ids, max_model_len=max_model_len)
        return await self.session.post(worker.url + path, data=json.dumps(payload).encode(), headers=headers)

    async def _read_until_first_token(self, events: AsyncIterator[dict], worker: Worker, excluded: set[str]):
        prompt_tokens = 0
        try:
            async for event in events:
                kind = event.get("type")
                if kind == "start":
                    prompt_tokens = int(event.get("prompt_tokens") or 0)
                elif kind == "token":
                    return prompt_tokens, [(event.get("text") or "", list(event.get("token_ids") or ()))], None
                elif kind == "done":
                    finish = Finish(event.get("finish_reason"), int(event.get("prompt_tokens") or prompt_tokens),
                                    int(event.get("completion_tokens") or 0))
                    return finish.prompt_tokens, [], finish
                elif kind == "error":
                    excluded.add(worker.url)
                    raise AttemptFailed(str(event.get("kind") or "worker_error"),
                                        f"{worker.url}: {event.get('message')}")
        except ValueError as exc:
            excluded.add(worker.url)
            raise AttemptFailed("bad_worker_answer", f"{worker.url} sent a line that is not JSON: {exc}") from None
        excluded.add(worker.url)
        raise AttemptFailed("worker_disconnected", f"{worker.url} closed the stream before the first token")

    # -- disaggregated ------------------------------------------------------------------------------------------------

    async def _start_disaggregated(self, group: Group, plan: Plan, request_id: str, body: dict, excluded: set[str],
                                   accepted: Callable[[], None] | None = None) -> Leg:
        prefill, decode = plan.first, plan.decode
        release_prefill = self._acquire(prefill)
        release_decode = self._acquire(decode)
        try:
            # Where the prefill worker pushes the KV: the decode worker, or its KV address (a chaos KV fault's proxy,
            # which only the push crosses: this gateway's own stream and probes go to decode.url).
            fields = {"request_id": request_id, **body, "decode_url": decode.kv_url or decode.url}
            # the prefill worker converts its KV to the decode worker's KV cache dtype (a worker that does not say
            # one keeps its cache in its model's dtype)
            if decode.kv_cache_dtype or decode.dtype:
                fields["decode_kv_dtype"] = decode.kv_cache_dtype or decode.dtype
            payload = json.dumps(fields).encode()
            result, prompt_tokens = await self._unless_ejected(
                self._prefill(group, prefill, decode, payload, excluded), (prefill, decode), excluded)
        except BaseException:
            release_decode()
            raise
        finally:
            release_prefill()
        if accepted is not None:
            accepted()
        first_token_id = result.get("first_token_id")
        # None: a resumed request whose earlier tokens already ended it (the prefill worker only flushed its text).
        pending = [(result.get("text") or "", [] if first_token_id is None else [first_token_id])]
        if result.get("finished"):
            release_decode()
            num_resumed = len(body.get("resume_token_ids") or ())
            finish = Finish(result.get("finish_reason"), prompt_tokens, num_resumed + len(pending[0][1]))
            return Leg(prompt_tokens, pending, finish, streamed_by=prefill.url)
        responses: list[aiohttp.ClientResponse] = []
        return Leg(prompt_tokens, pending, None, self._decode_events(decode, request_id, responses, group),
                   [release_decode], responses, decode.url, lambda reason: self.router.mark_down(decode, reason),
                   decode.ejected)

    async def _prefill(self, group: Group, prefill: Worker, decode: Worker, payload: bytes,
                       excluded: set[str]) -> tuple[dict, int]:
        """POST /v1/prefill, which answers once the KV is on the decode worker: (answer, prompt tokens)."""
        try:
            async with self.session.post(prefill.url + "/v1/prefill", data=payload,
                                         headers=self._headers(group)) as resp:
                if resp.status == 502:
                    await self._kv_transfer_failed(resp, prefill, decode, excluded)
                if resp.status != 200:
                    await self._classify(resp, prefill, excluded)
                result = await resp.json(content_type=None)
                return result, int(result.get("prompt_tokens") or 0)
        except TRANSPORT_ERRORS as exc:
            raise self._transport_failed(prefill, excluded, exc) from None
        except (ValueError, TypeError, AttributeError) as exc:
            excluded.add(prefill.url)
            raise AttemptFailed("bad_worker_answer", f"prefill {prefill.url} answered {exc}") from None

    @staticmethod
    async def _unless_ejected(work: Coroutine, workers: tuple[Worker, ...], excluded: set[str]):
        """`work`'s result, unless the router takes one of `workers` out of rotation first: then the attempt fails
        at once (retried without that worker). A prefill request holds the KV push, which a hung or partitioned
        decode worker would otherwise hold for the prefill worker's whole --kv-push-timeout (30 s)."""
        task = asyncio.ensure_future(work)
        gone = {asyncio.ensure_future(worker.ejected.wait()): worker for worker in workers}
        try:
            await asyncio.wait((task, *gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in gone:
                waiter.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled():
            return task.result()
        worker = next(worker for waiter, worker in gone.items() if waiter.done() and not waiter.cancelled())
        excluded.add(worker.url)
        raise AttemptFailed("worker_ejected", f"{worker.role.value} worker {worker.url} was taken out of rotation "
                                              f"before the first token: {worker.reason}")

    async def _kv_transfer_failed(self, resp: aiohttp.ClientResponse, prefill: Worker, decode: Worker,
                                  excluded: set[str]) -> None:
        """A 502 from prefill: with type kv_transfer_error the decode side failed, so retry on another decode."""
        try:
            error = (await resp.json(content_type=None)).get("error") or {}
        except (ValueError, AttributeError, *TRANSPORT_ERRORS):
            error = {}
        if error.get("type") != "kv_transfer_error":
            return  # an ordinary 502 from the prefill worker itself: _classify handles it
        excluded.add(decode.url)
        message = f"prefill {prefill.url} could not hand the KV cache to decode {decode.url}: {error.get('message')}"
        if error.get("code") == "decode_unreachable":
            self.router.mark_down(decode, f"unreachable from prefill: {error.get('message')}")
        elif error.get("code") == "decode_full":
            # Backpressure (429 to the client if no other decode worker has room), not a failure (502).
            raise AttemptFailed("overloaded", message)
        raise AttemptFailed("kv_transfer", message)

    async def _decode_events(self, decode: Worker, request_id: str, responses: list[aiohttp.ClientResponse],
                             group: Group) -> AsyncIterator[dict]:
        """The decode worker's stream, opened on first use; its response joins `responses` for TokenStream.close."""
        resp = await self.session.get(f"{decode.url}/v1/stream/{request_id}", headers=self._headers(group))
        responses.append(resp)
        if resp.status != 200:
            # It lost the request (restarted, or the stream came too late): another decode worker can take it.
            raise StreamBroken("decode_stream", f"decode {decode.url} answered HTTP {resp.status} for the "
                                                f"token stream: {await _error_text(resp)}", migratable=True)
        async for event in ndjson.read(resp.content):
            if event.get("type") != "start":
                yield event
