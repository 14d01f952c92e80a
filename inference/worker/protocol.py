"""The worker's request bodies and error answers (docs/contracts.md, "Worker HTTP API").

Everything a client sends is checked here, at the edge, with an OpenAI-shaped error that names the parameter:
`{"error": {"message", "type", "param", "code"}}`. Nothing past this module sees an unchecked value.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from aiohttp import web

from inference.engine.sequence import SamplingParams

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")  # it travels in URL paths (/v1/stream/{request_id})
MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 256
MAX_MESSAGES = 1024


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
    # max_tokens was null: generate up to the end of the context (OpenAI's chat default), known once tokenized.
    max_tokens_to_context: bool = False

    def fit_to_context(self, num_prompt_tokens: int, max_model_len: int) -> None:
        """Resolve a null max_tokens, then refuse a prompt that leaves no room (400 naming both numbers)."""
        if self.max_tokens_to_context:
            self.params = replace(self.params, max_tokens=max(1, max_model_len - num_prompt_tokens))
        check_fits(num_prompt_tokens, self.params.max_tokens, max_model_len)

    def sampling_header(self) -> dict:
        """The `sampling` object of the KV header: the same fields as the request body."""
        return sampling_dict(self.params, self.stop)


def sampling_dict(params: SamplingParams, stop: list[str]) -> dict:
    return {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "seed": params.seed, "ignore_eos": params.ignore_eos, "stop": list(stop)}


def parse_json(raw: bytes):
    if not raw:
        raise RequestError("request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None


def parse_generate(body, *, need_decode_url: bool) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {_json_type(body)}")
    request_id = body.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not REQUEST_ID_RE.match(request_id)):
        raise RequestError("request_id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="request_id")
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise RequestError("give exactly one of 'prompt' and 'messages'", param="prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise RequestError(f"prompt must be a string, got {_json_type(prompt)}", param="prompt")
        if not prompt:
            raise RequestError("prompt must not be empty", param="prompt")
    else:
        messages = _parse_messages(messages)
    params, stop = parse_sampling(body, allow_null_max_tokens=True)
    decode_url = None
    if need_decode_url:
        decode_url = body.get("decode_url")
        if not isinstance(decode_url, str) or urlsplit(decode_url).scheme not in ("http", "https") \
                or not urlsplit(decode_url).hostname:
            raise RequestError("decode_url must be an http(s) URL such as http://127.0.0.1:8002",
                               param="decode_url")
        decode_url = decode_url.rstrip("/")
    return GenerateRequest(request_id=request_id, prompt=prompt, messages=messages, params=params, stop=stop,
                           max_tokens_to_context="max_tokens" in body and body["max_tokens"] is None,
                           decode_url=decode_url)


def parse_sampling(body: dict, allow_null_max_tokens: bool = False) -> tuple[SamplingParams, list[str]]:
    """Sampling fields of a request body or of a KV header's `sampling` object; absent fields take defaults."""
    max_tokens = body.get("max_tokens", 16)
    if max_tokens is None and allow_null_max_tokens:
        max_tokens = 1  # a placeholder the caller replaces once the prompt length is known (fit_to_context)
    if not _is_int(max_tokens) or max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {max_tokens!r}", param="max_tokens")
    temperature = body.get("temperature", 0.0)
    if temperature is None:
        temperature = 0.0
    if not _is_number(temperature) or not 0.0 <= temperature <= 100.0:
        raise RequestError(f"temperature must be a number in [0, 100], got {temperature!r}", param="temperature")
    top_p = body.get("top_p", 1.0)
    top_p = 1.0 if top_p is None else top_p
    if not _is_number(top_p) or not 0.0 < top_p <= 1.0:
        raise RequestError(f"top_p must be a number in (0, 1], got {top_p!r}", param="top_p")
    top_k = body.get("top_k", 0)
    top_k = 0 if top_k is None else top_k
    if not _is_int(top_k) or top_k < 0:
        raise RequestError(f"top_k must be an integer >= 0, got {top_k!r}", param="top_k")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError(f"seed must be null or an integer in [0, 2^63), got {seed!r}", param="seed")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"ignore_eos must be a boolean, got {ignore_eos!r}", param="ignore_eos")
    stop = _parse_stop(body.get("stop"))
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                                top_k=top_k, seed=seed, ignore_eos=ignore_eos)
    except ValueError as exc:  # the engine's own checks, should they be stricter than ours
        raise RequestError(str(exc)) from None
    return params, stop


def check_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens + max_tokens > max_model_len:
        raise RequestError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has {num_prompt_tokens} "
            f"tokens and max_tokens is {max_tokens} ({num_prompt_tokens + max_tokens} in all)",
            param="max_tokens", code="context_length_exceeded")


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


def _parse_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    if any(not s or len(s) > MAX_STOP_LEN for s in stop):
        raise RequestError(f"stop strings must be 1-{MAX_STOP_LEN} characters", param="stop")
    return stop


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # NaN != NaN


def _json_type(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
