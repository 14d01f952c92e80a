"""The worker's request bodies and error answers (docs/contracts.md, "Worker HTTP API").

Everything a client sends is checked here, at the edge, with an OpenAI-shaped error that names the parameter:
`{"error": {"message", "type", "param", "code"}}` (sampling fields by `inference.sampling_params`, which the gateway
and the engine share). Nothing past this module sees an unchecked value.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from aiohttp import web

from inference import json_body, sampling_params
from inference.checks import is_int, json_type
from inference.engine.sequence import PRIORITY_BANDS, STANDARD_PRIORITY
from inference.sampling_params import SamplingError, SamplingParams, sampling_fields

KV_DTYPES = ("float32", "bfloat16", "float16")  # what a KV payload may carry, and convert between
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")  # it travels in URL paths (/v1/stream/{request_id})
MAX_MESSAGES = 1024
MAX_CACHE_SALT_CHARS = 256
MAX_ITL_TARGET_S = 3600.0


class RequestError(Exception):
    """An answer other than 200, raised anywhere in a handler and rendered by the error middleware."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None, kind: str | None = None,
                 counted: bool = False):
        super().__init__(message)
        self.counted = counted  # the engine loop already counted this failure (an error event turned into HTTP)
        self.message, self.status, self.param, self.code, self.type = message, status, param, code, type
        self.headers = headers or {}
        # The tandem_request_errors_total{kind} label this answer counts under.
        self.kind = kind or {400: "invalid_request", 404: "not_found", 409: "conflict", 413: "too_large",
                             429: "overloaded", 502: "kv_transfer", 503: "unavailable"}.get(status, "internal")

    def response(self) -> web.Response:
        return error_response(self.message, status=self.status, type=self.type, param=self.param, code=self.code,
                              headers=self.headers)


def error_response(message: str, *, status: int, type: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


@dataclass(slots=True)
class GenerateRequest:
    """A checked /v1/generate or /v1/prefill body."""

    request_id: str | None  # None: the worker names it
    prompt: str | None
    messages: list[dict] | None
    params: SamplingParams
    stop: list[str]
    decode_url: str | None = None
    # The decode worker's KV dtype, as the gateway saw it on its /health: the prefill worker converts the KV to it.
    decode_kv_dtype: str | None = None
    # max_tokens was null: generate up to the end of the context (OpenAI's chat default), known once tokenized.
    max_tokens_to_context: bool = False
    # Tokens this request generated on a worker that died; the gateway sent them on (docs/contracts.md).
    resume_token_ids: list[int] = field(default_factory=list)
    # The digest of the body's `cache_salt` (the gateway sends its tenant): its prefix-cache blocks are its tenant's
    # own (inference/engine/prefix_cache.py). b"": none, shared with every unsalted request.
    cache_salt: bytes = b""
    # Its band in the worker's waiting queue, from the body's `priority` (the gateway sends its tenant's class):
    # an index into PRIORITY_BANDS; absent: standard.
    priority: int = STANDARD_PRIORITY
    # The deployment's ITL objective, from the body's `itl_target_s` (the gateway sends it): it bounds the decode
    # batch this request runs in (inference/engine/batch_limit.py). None: none.
    itl_target_s: float | None = None

    def fit_to_context(self, num_prompt_tokens: int, context: dict, vocab_size: int) -> None:
        """Resolve a null max_tokens and cap it to what this worker's KV pool holds (see fit_max_tokens), then refuse
        resumed tokens that this model cannot have generated for it, and a logit bias on tokens it does not have.
        `context`: the worker's info."""
        if self.max_tokens_to_context:
            max_tokens = max(1, context["configured_max_model_len"] - num_prompt_tokens)
        else:
            max_tokens = self.params.max_tokens
        self.params = replace(self.params, max_tokens=fit_max_tokens(num_prompt_tokens, max_tokens, context))
        num_resumed = len(self.resume_token_ids)
        if num_resumed > self.params.max_tokens:
            raise RequestError(f"resume_token_ids holds {num_resumed} tokens, more than max_tokens "
                               f"({self.params.max_tokens})", param="resume_token_ids")
        if any(t >= vocab_size for t in self.resume_token_ids):
            raise RequestError(f"resume_token_ids must hold token ids below this model's vocabulary size of "
                               f"{vocab_size}", param="resume_token_ids")
        check_logit_bias(self.params, vocab_size)

    def sampling_header(self) -> dict:
        """The `sampling` object of the KV header: the same fields as the request body."""
        return sampling_fields(self.params, self.stop)

    def scheduling_header(self) -> dict:
        """The `scheduling` object of the KV header: what orders and bounds the request at the decode worker too (its
        band, its tenant's salt digest, its ITL objective)."""
        header = {"priority": PRIORITY_BANDS[self.priority]}
        if self.cache_salt:
            header["tenant"] = self.cache_salt.hex()
        if self.itl_target_s is not None:
            header["itl_target_s"] = self.itl_target_s
        return header


def parse_json(raw: bytes):
    """Parsed JSON, or 400: not JSON, nested deeper than json_body.MAX_JSON_DEPTH, or text that is not valid Unicode
    (a lone surrogate makes the tokenizer raise), naming the field."""
    if not raw:
        raise RequestError("request body is empty; expected a JSON object")
    try:
        return json_body.loads(raw)
    except json_body.JSONBodyError as exc:
        raise RequestError(exc.message, param=exc.param, code=exc.code) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None


def parse_generate(body, *, need_decode_url: bool) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {json_type(body)}")
    request_id = body.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not REQUEST_ID_RE.match(request_id)):
        raise RequestError("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="request_id")
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise RequestError("give exactly one of 'prompt' and 'messages'", param="prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise RequestError(f"prompt must be a string, got {json_type(prompt)}", param="prompt")
        if not prompt:
            raise RequestError("prompt must not be empty", param="prompt")
    else:
        messages = _parse_messages(messages)
    params, stop = parse_sampling(body, allow_null_max_tokens=True)
    resume_token_ids = body.get("resume_token_ids")
    if resume_token_ids is None:
        resume_token_ids = []
    elif not isinstance(resume_token_ids, list) or not all(is_int(t) and t >= 0 for t in resume_token_ids):
        raise RequestError("resume_token_ids must be a list of token ids (integers >= 0)", param="resume_token_ids")
    decode_url = None
    if need_decode_url:
        decode_url = body.get("decode_url")
        if not isinstance(decode_url, str) or urlsplit(decode_url).scheme not in ("http", "https") \
                or not urlsplit(decode_url).hostname:
            raise RequestError("decode_url must be an http(s) URL such as http://127.0.0.1:8002",
                               param="decode_url")
        decode_url = decode_url.rstrip("/")
    decode_kv_dtype = body.get("decode_kv_dtype") if need_decode_url else None
    if decode_kv_dtype is not None and decode_kv_dtype not in KV_DTYPES:
        raise RequestError(f"decode_kv_dtype must be one of {', '.join(KV_DTYPES)}, got {decode_kv_dtype!r}",
                           param="decode_kv_dtype")
    return GenerateRequest(request_id=request_id, prompt=prompt, messages=messages, params=params, stop=stop,
                           max_tokens_to_context="max_tokens" in body and body["max_tokens"] is None,
                           decode_url=decode_url, decode_kv_dtype=decode_kv_dtype,
                           resume_token_ids=resume_token_ids, cache_salt=_parse_cache_salt(body.get("cache_salt")),
                           priority=_parse_priority(body.get("priority")),
                           itl_target_s=parse_itl_target(body.get("itl_target_s")))


def parse_itl_target(value) -> float | None:
    """`itl_target_s`: seconds > 0 and at most an hour, or absent/null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_ITL_TARGET_S:
        raise RequestError(f"itl_target_s must be a number of seconds in (0, {MAX_ITL_TARGET_S:g}], got {value!r}",
                           param="itl_target_s")
    return float(value)


def parse_scheduling(header) -> tuple[int, bytes, float | None]:
    """The KV header's optional `scheduling` object (GenerateRequest.scheduling_header) → (priority, tenant salt
    digest, itl_target_s); absent: standard, none, none."""
    if header is None:
        return STANDARD_PRIORITY, b"", None
    if not isinstance(header, dict):
        raise RequestError("header field 'scheduling' must be an object", code="bad_kv_payload")
    tenant = header.get("tenant")
    try:
        salt = b"" if tenant is None else bytes.fromhex(tenant)
    except (TypeError, ValueError):
        salt = None
    if salt is None or len(salt) > 64:
        raise RequestError("header field 'scheduling.tenant' must be a hex digest", code="bad_kv_payload")
    return _parse_priority(header.get("priority")), salt, parse_itl_target(header.get("itl_target_s"))


def _parse_priority(priority) -> int:
    if priority is None:
        return STANDARD_PRIORITY
    if not isinstance(priority, str) or priority not in PRIORITY_BANDS:
        raise RequestError(f"priority must be one of {', '.join(PRIORITY_BANDS)}, got {priority!r}",
                           param="priority")
    return PRIORITY_BANDS.index(priority)


def _parse_cache_salt(salt) -> bytes:
    """A 16-byte digest of the salt text (any length up to the limit keys blake2b alike), or b"" for none."""
    if salt is None:
        return b""
    if not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
        got = f"{len(salt)} characters" if isinstance(salt, str) else json_type(salt)
        raise RequestError(f"cache_salt must be a string of 1-{MAX_CACHE_SALT_CHARS} characters, got {got}",
                           param="cache_salt")
    return hashlib.blake2b(salt.encode(), digest_size=16, person=b"tandem-salt").digest()


def parse_sampling(body: dict, allow_null_max_tokens: bool = False) -> tuple[SamplingParams, list[str]]:
    """Sampling fields of a request body or of a KV header's `sampling` object; absent fields take defaults."""
    try:
        return sampling_params.parse_sampling(body, allow_null_max_tokens=allow_null_max_tokens)
    except SamplingError as exc:
        raise RequestError(str(exc), param=exc.param, code=exc.code) from None


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """400 naming logit_bias when it names a token id this model's vocabulary does not have."""
    if params.logit_bias and params.logit_bias[-1][0] >= vocab_size:  # sorted by token id: the last is the largest
        raise RequestError(f"logit_bias names token {params.logit_bias[-1][0]}, outside this model's vocabulary of "
                           f"{vocab_size} tokens", param="logit_bias", code="invalid_value")


def fit_max_tokens(num_prompt_tokens: int, max_tokens: int, context: dict) -> int:
    """max_tokens capped to what fits this worker, or 400 naming the numbers. `context` (the worker's info) holds
    `configured_max_model_len`, the model's context (or --max-model-len), and `max_model_len`, what the KV pool holds
    of it.

    1. A request that asks for more than the model's context is the limit itself: 400, as OpenAI answers.
    2. A prompt that alone fills what the pool holds can never run: 400 naming both numbers.
    3. Otherwise the pool, not the request, is the limit: max_tokens shrinks so that prompt + max_tokens fits, and the
       request ends with finish_reason "length" there. A decode worker's reservation then always fits an empty pool.
    """
    configured, pool = context["configured_max_model_len"], context["max_model_len"]
    if num_prompt_tokens + max_tokens > configured:
        raise RequestError(
            f"this model's maximum context length is {configured} tokens; the prompt has {num_prompt_tokens} "
            f"tokens and max_tokens is {max_tokens} ({num_prompt_tokens + max_tokens} in all)",
            param="max_tokens", code="context_length_exceeded")
    if num_prompt_tokens >= pool:
        raise RequestError(
            f"the prompt has {num_prompt_tokens} tokens, but this worker's KV pool holds a context of {pool} tokens "
            f"(prompt and at least one generated token): shorten the prompt to at most {pool - 1} tokens",
            param="prompt", code="context_length_exceeded")
    return min(max_tokens, pool - num_prompt_tokens)


def _parse_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"at most {MAX_MESSAGES} messages", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"messages[{i}] must be an object with string 'role' and 'content'",
                               param=f"messages[{i}]")
        out.append({"role": m["role"], "content": m["content"]})
    return out
