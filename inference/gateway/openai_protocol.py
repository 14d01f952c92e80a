"""OpenAI's wire format: request validation into the worker's body, response and SSE chunk shapes, errors.

Validation happens here, at the edge, so that every bad input becomes a 4xx naming the offending parameter and
nothing malformed reaches a worker. Tokenization does not: the worker owns the tokenizer, so prompt-length checks
come back from it (and are relayed unchanged), but for a prompt of more characters than any tokenization can fit
in the context (prompt_too_long), refused here before it costs a worker's tokenizer time.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from inference import json_body
from inference.checks import is_int, json_type
from inference.sampling_params import (DEFAULT_MAX_TOKENS, OPENAI_MAX_TEMPERATURE, SamplingError, parse_sampling,
                                       sampling_fields)

# /v1/completions defaults to DEFAULT_MAX_TOKENS (16), as OpenAI's legacy endpoint does; chat runs to the end of the
# context, which only the worker that tokenized the prompt knows.
OPENAI_DEFAULT_TEMPERATURE = 1.0  # the worker's default is 0 (greedy)
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


class Endpoint(str, Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(slots=True)
class GenerationRequest:
    """A validated OpenAI request: the worker body (minus request_id) plus what shapes the answer."""

    endpoint: Endpoint
    worker_body: dict
    stream: bool
    include_usage: bool
    user: str | None = None  # OpenAI's end-user id: the sticky key of a traffic split (never sent to a worker)


# ---------------------------------------------------------------------------------------------------------------------
# Field checks: the sampling fields go through inference.sampling_params, which the worker and the engine share.

def _optional_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean, got {json_type(value)}", name, "invalid_type")
    return value


def _user(body: dict) -> str | None:
    user = body.get("user")
    if user is None:
        return None
    if not isinstance(user, str):
        raise invalid(f"'user' must be a string, got {json_type(user)}", "user", "invalid_type")
    return user or None


# Every top-level field each endpoint accepts (docs/openai-api.md says what each does). Any other field answers 400
# naming it: a client must never believe that a setting took effect when it did not.
_COMMON_FIELDS = (
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "user",
    "logit_bias", "presence_penalty", "frequency_penalty",
    "n", "logprobs", "top_logprobs",  # at their defaults only: one choice, no log probabilities
    "top_k", "ignore_eos",  # vLLM's extensions
)
ACCEPTED_FIELDS: Mapping[Endpoint, frozenset[str]] = MappingProxyType({
    Endpoint.COMPLETIONS: frozenset(_COMMON_FIELDS + ("prompt", "best_of", "echo", "suffix")),
    Endpoint.CHAT: frozenset(_COMMON_FIELDS + ("messages", "max_completion_tokens", "response_format",
                                               "tools", "functions", "tool_choice", "function_call")),
})
# Chat fields that ask for function calling, which this gateway does not do: 400 unless null (tools and functions:
# unless null or empty, i.e. no tools).
_TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call")


def _check_unsupported(body: dict, endpoint: Endpoint) -> None:
    """Reject what the gateway cannot honour rather than silently answering something else."""
    accepted = ACCEPTED_FIELDS[endpoint]
    unknown = [name for name in body if name not in accepted]
    if unknown:
        raise invalid(f"unrecognized request argument supplied: '{unknown[0]}' (this endpoint accepts: "
                      f"{', '.join(sorted(accepted))})", unknown[0], "unknown_parameter")
    for name in _TOOL_FIELDS:
        if body.get(name) not in (None, []):
            raise invalid(f"'{name}' is not supported: this gateway does not call functions or tools", name,
                          "unsupported_parameter")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid(f"only 'response_format' {{\"type\": \"text\"}} is supported (no JSON mode or schema), got "
                      f"{json.dumps(response_format)[:200]}", "response_format", "unsupported_value")
    n = body.get("n")
    if n is not None and (not is_int(n) or n != 1):
        raise invalid(f"only n=1 is supported, got {n!r}", "n", "unsupported_value")
    best_of = body.get("best_of")
    if best_of is not None and (not is_int(best_of) or best_of != 1):
        raise invalid(f"only best_of=1 is supported, got {best_of!r}", "best_of", "unsupported_value")
    if body.get("echo"):
        raise invalid("'echo' is not supported", "echo", "unsupported_value")
    # `is`, not `in`: the legacy endpoint's logprobs=0 (== False) asks for the chosen tokens' log probabilities.
    if not (body.get("logprobs") is None or body.get("logprobs") is False):
        raise invalid("'logprobs' is not supported: no log probabilities", "logprobs", "unsupported_value")
    if body.get("top_logprobs") is not None:
        raise invalid("'top_logprobs' is not supported: no log probabilities", "top_logprobs", "unsupported_value")
    if body.get("suffix"):
        raise invalid("'suffix' is not supported", "suffix", "unsupported_value")


def requested_model(body: dict) -> str:
    """The body's `model`: 400 where it is missing or not a string."""
    model = body.get("model")
    if model is None:
        raise invalid("you must provide a 'model' parameter", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise invalid(f"'model' must be a string, got {json_type(model)}", "model", "invalid_type")
    return model


def _common(body: dict, endpoint: Endpoint, served_model_name: str, max_tokens_names: tuple[str, ...],
            default_max_tokens: int | None, defaults: Mapping) -> tuple[dict, bool, bool]:
    """The sampling fields, OpenAI's conventions mapped onto the worker's. `defaults` (the deployment's sampling
    defaults) fill a field the request leaves out or sends as null; a value the request gives always wins."""
    model = requested_model(body)
    if model != served_model_name:
        raise ApiError(404, f"The model '{model}' does not exist; this gateway serves '{served_model_name}'",
                       param="model", code="model_not_found")
    _check_unsupported(body, endpoint)
    max_tokens_name, max_tokens = max_tokens_names[0], None
    for name in max_tokens_names:  # the first present wins: max_completion_tokens supersedes max_tokens in chat
        if body.get(name) is not None:
            max_tokens_name, max_tokens = name, body[name]
            break
    stream = _optional_bool(body, "stream", False)
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise invalid("'stream_options' must be an object", "stream_options", "invalid_type")
        if not stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options",
                          "invalid_value")
        include_usage = _optional_bool(stream_options, "include_usage", False)
    if max_tokens is None:
        max_tokens = defaults.get("max_tokens", default_max_tokens)
    temperature = body.get("temperature")
    if temperature is None:
        temperature = defaults.get("temperature", OPENAI_DEFAULT_TEMPERATURE)
    top_k, stop = body.get("top_k"), body.get("stop")
    if top_k is None:
        top_k = defaults.get("top_k")
    fields = {  # OpenAI's conventions, mapped onto the worker's sampling fields
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": body["top_p"] if body.get("top_p") is not None else defaults.get("top_p"),
        "top_k": 0 if is_int(top_k) and top_k == -1 else top_k,  # -1 is vLLM's spelling of "no top-k"
        "seed": body.get("seed"),
        # OpenAI ignores empty stop strings; the worker refuses them.
        "stop": [s for s in stop if s != ""] if isinstance(stop, list) else (None if stop == "" else stop),
        "ignore_eos": False if body.get("ignore_eos") is None else body["ignore_eos"],
        "logit_bias": body.get("logit_bias"),
        "presence_penalty": body.get("presence_penalty"),
        "frequency_penalty": body.get("frequency_penalty"),
    }
    try:
        params, stop = parse_sampling(fields, allow_null_max_tokens=True)
    except SamplingError as exc:
        param = max_tokens_name if exc.param == "max_tokens" else exc.param
        raise invalid(f"'{param}' {exc.requirement}", param, exc.code) from None
    if params.temperature > OPENAI_MAX_TEMPERATURE:
        raise invalid(f"'temperature' must be in [0, {OPENAI_MAX_TEMPERATURE:g}], got {temperature}",
                      "temperature", "invalid_value")
    worker_body = sampling_fields(params, stop)
    # None asks the worker for the rest of the context: only it knows the prompt's length in tokens.
    worker_body["max_tokens"] = fields["max_tokens"]
    return worker_body, stream, include_usage


def parse_json_object(raw: bytes) -> dict:
    """The body as a dict; 400 for what is not JSON, nests too deep, or holds text that is not valid Unicode (a lone
    surrogate would reach a worker's tokenizer and fail there), naming the field."""
    try:
        body = json_body.loads(raw)
    except json_body.JSONBodyError as exc:
        raise invalid(exc.message, exc.param, exc.code) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid(f"the body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {json_type(body)}", None, "invalid_type")
    return body


def parse_completion(body: dict, served_model_name: str, defaults: Mapping = MappingProxyType({})) -> GenerationRequest:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("you must provide a 'prompt' parameter", "prompt", "missing_required_parameter")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise invalid("'prompt' must be a string or a list of exactly one string (batches and token ids are "
                          "not supported)", "prompt", "invalid_type")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid(f"'prompt' must be a string, got {json_type(prompt)}", "prompt", "invalid_type")
    if not prompt:
        raise invalid("'prompt' must not be empty", "prompt", "invalid_value")
    worker_body, stream, include_usage = _common(body, Endpoint.COMPLETIONS, served_model_name, ("max_tokens",),
                                                 DEFAULT_MAX_TOKENS, defaults)
    worker_body["prompt"] = prompt
    worker_body["messages"] = None
    return GenerationRequest(Endpoint.COMPLETIONS, worker_body, stream, include_usage, _user(body))


def _message_content(message: dict, index: int) -> str:
    content = message.get("content")
    param = f"messages[{index}].content"
    if content is None:
        if message.get("role") == "assistant":
            return ""
        raise invalid(f"'{param}' is required", param, "missing_required_parameter")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"'{param}' must be a string or a list of text parts", param, "invalid_type")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(f"'{param}' parts must be {{\"type\": \"text\", \"text\": str}} (only text is supported)",
                          param, "invalid_type")
        texts.append(part["text"])
    return "\n".join(texts)


def parse_chat(body: dict, served_model_name: str, defaults: Mapping = MappingProxyType({})) -> GenerationRequest:
    messages = body.get("messages")
    if messages is None:
        raise invalid("you must provide a 'messages' parameter", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid(f"'messages' must be a list, got {json_type(messages)}", "messages", "invalid_type")
    if not messages:
        raise invalid("'messages' must not be empty", "messages", "invalid_value")
    worker_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"'messages[{i}]' must be an object", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise invalid(f"'messages[{i}].role' must be one of {sorted(CHAT_ROLES)}, got {role!r}",
                          f"messages[{i}].role", "invalid_value")
        worker_messages.append({"role": role, "content": _message_content(message, i)})
    if not any(m["content"] for m in worker_messages):
        raise invalid("'messages' must hold some text", "messages", "invalid_value")
    worker_body, stream, include_usage = _common(body, Endpoint.CHAT, served_model_name,
                                                 ("max_completion_tokens", "max_tokens"), None, defaults)
    worker_body["prompt"] = None
    worker_body["messages"] = worker_messages
    return GenerationRequest(Endpoint.CHAT, worker_body, stream, include_usage, _user(body))


# ---------------------------------------------------------------------------------------------------------------------
# Answers.

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(endpoint: Endpoint, request_id: str, created: int, model: str, text: str,
                        finish_reason: str | None, prompt_tokens: int, completion_tokens: int) -> dict:
    if endpoint is Endpoint.CHAT:
        obj = "chat.completion"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason,
                  "logprobs": None}
    else:
        obj = "text_completion"
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


class ChunkEncoder:
    """Encodes SSE chunks of one stream.

    Everything but the text delta is fixed for a stream, so each chunk is a precomputed prefix and suffix around one
    json.dumps of the delta: the per-token cost stays a string escape, not a dict encode (the gateway's added latency
    is a benchmark goal).
    """

    __slots__ = ("_head", "_text_prefix", "_text_suffix", "_endpoint", "_usage_null", "_is_first")

    def __init__(self, endpoint: Endpoint, request_id: str, created: int, model: str, include_usage: bool) -> None:
        self._endpoint = endpoint
        obj = "chat.completion.chunk" if endpoint is Endpoint.CHAT else "text_completion"
        head = json.dumps({"id": request_id, "object": obj, "created": created, "model": model})[:-1]
        self._head = head
        # OpenAI sends "usage": null on every chunk but the last when usage was asked for.
        self._usage_null = ',"usage":null' if include_usage else ""
        if endpoint is Endpoint.CHAT:
            self._text_prefix = head + ',"choices":[{"index":0,"delta":{"content":'
            self._text_suffix = '},"finish_reason":null,"logprobs":null}]' + self._usage_null + "}\n\n"
        else:
            self._text_prefix = head + ',"choices":[{"index":0,"text":'
            self._text_suffix = ',"finish_reason":null,"logprobs":null}]' + self._usage_null + "}\n\n"
        self._is_first = True

    def text(self, delta: str) -> bytes:
        if self._is_first and self._endpoint is Endpoint.CHAT:
            # The first chat chunk carries the assistant role, as OpenAI's does.
            self._is_first = False
            return ("data: " + self._head + ',"choices":[{"index":0,"delta":{"role":"assistant","content":'
                    + json.dumps(delta) + self._text_suffix).encode()
        self._is_first = False
        return ("data: " + self._text_prefix + json.dumps(delta) + self._text_suffix).encode()

    def finish(self, finish_reason: str | None) -> bytes:
        if self._endpoint is Endpoint.CHAT:
            delta = '"delta":{"role":"assistant"},' if self._is_first else '"delta":{},'
            choice = '{"index":0,' + delta
        else:
            choice = '{"index":0,"text":"",'
        self._is_first = False
        return ("data: " + self._head + ',"choices":[' + choice + '"finish_reason":' + json.dumps(finish_reason)
                + ',"logprobs":null}]' + self._usage_null + "}\n\n").encode()

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return ("data: " + self._head + ',"choices":[],"usage":' + json.dumps(usage(prompt_tokens, completion_tokens))
                + "}\n\n").encode()


def sse_error(error: ApiError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def prompt_too_long(worker_body: dict, max_chars: int | None) -> ApiError | None:
    """A 400 for a prompt that cannot fit the context in any tokenization (more characters than max_model_len
    tokens can spell, as the workers' /health says): refused here, before it costs a worker's tokenizer time."""
    if not max_chars:
        return None
    prompt = worker_body.get("prompt")
    num_chars = len(prompt) if isinstance(prompt, str) else sum(
        len(m.get("content") or "") if isinstance(m.get("content"), str) else
        sum(len(part.get("text") or "") for part in m.get("content") or () if isinstance(part, dict))
        for m in worker_body.get("messages") or ())
    if num_chars <= max_chars:
        return None
    return ApiError(400, f"the prompt has {num_chars} characters; no prompt over {max_chars} fits this model's "
                         "context", param="messages" if prompt is None else "prompt", code="context_length_exceeded")
