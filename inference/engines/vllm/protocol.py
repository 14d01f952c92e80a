"""How the gateway talks to a vLLM worker: a Tandem worker request turned into vLLM's OpenAI streaming request, and
vLLM's server-sent events turned back into Tandem's worker events (docs/contracts.md, "Worker HTTP API"), so that
everything past the relay (retries, migration, usage, TTFT/ITL as the client sees them) is the same for both engines.

- A request with `prompt` goes to /v1/completions, one with `messages` to /v1/chat/completions (vLLM applies the
  model's chat template), streamed, with `return_token_ids` (the gateway keeps the token ids it relayed, to resume
  the request elsewhere) and usage on every chunk (the prompt's length before the first token).
- A resumed request (`resume_token_ids`: its worker died mid-stream) is recomputed: the prompt is tokenized by the
  new worker's /tokenize (the chat template applied for messages), the tokens already sent are appended, and the
  whole goes to /v1/completions as token ids, asking for the tokens still owed. vLLM detokenizes the continuation
  with the prompt as context, so the text goes on at the seam; a greedy request continues token-identically.
- The tenant's name goes as `cache_salt` (its prefix-cache blocks are its own, as on a Tandem worker); the priority
  class does not (vLLM refuses `priority` unless started with --scheduling-policy priority; the gateway's fair queue
  orders requests before they reach the worker).
- A request vLLM aborts (its shutdown timeout passed while draining) ends with an error event of kind `drain`, so that
  the gateway moves it on, as it does for a Tandem worker that drains.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

# Sampling fields of a worker body that vLLM's OpenAI API takes under the same names and meanings.
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "ignore_eos", "presence_penalty", "frequency_penalty")


class ResumeFailed(Exception):
    """The new worker could not tokenize the prompt of a request being resumed."""


def auth_headers(secret: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    return headers


def request_for(body: dict, served_name: str, *, prompt_ids: list[int] | None = None,
                max_model_len: int | None = None) -> tuple[str, dict]:
    """(path, JSON body) of vLLM's request for a Tandem worker body. `prompt_ids`: a resumed request's prompt,
    tokenized by the worker (its resumed tokens are appended here), with the worker's context length."""
    payload: dict = {"model": served_name, "stream": True, "return_token_ids": True,
                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    for key in _SAMPLING:
        if body.get(key) is not None:
            payload[key] = body[key]
    if body.get("stop"):
        payload["stop"] = list(body["stop"])
    if body.get("logit_bias"):
        payload["logit_bias"] = dict(body["logit_bias"])
    if isinstance(body.get("cache_salt"), str) and body["cache_salt"]:
        payload["cache_salt"] = body["cache_salt"]
    max_tokens = body.get("max_tokens")
    resumed = list(body.get("resume_token_ids") or ())
    if prompt_ids is not None:
        if max_tokens is None and max_model_len is not None:
            max_tokens = max_model_len - len(prompt_ids)
        if max_tokens is not None:
            payload["max_tokens"] = max(1, max_tokens - len(resumed))
        payload["prompt"] = [*prompt_ids, *resumed]
        return "/v1/completions", payload
    if body.get("messages") is not None:
        payload["messages"] = body["messages"]
        if max_tokens is not None:
            payload["max_completion_tokens"] = max_tokens
        return "/v1/chat/completions", payload
    payload["prompt"] = body["prompt"]
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    return "/v1/completions", payload


async def tokenize(session: aiohttp.ClientSession, url: str, served_name: str, body: dict,
                   headers: dict[str, str]) -> tuple[list[int], int | None]:
    """(prompt token ids, the worker's context length) of a request's prompt or messages, by the worker itself."""
    if body.get("messages") is not None:
        request = {"model": served_name, "messages": body["messages"], "add_generation_prompt": True}
    else:
        request = {"model": served_name, "prompt": body["prompt"]}
    async with session.post(url + "/tokenize", data=json.dumps(request).encode(), headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise ResumeFailed(f"{url}/tokenize answered HTTP {resp.status}: {text[:300]}")
    try:
        answer = json.loads(text)
        tokens = [int(t) for t in answer["tokens"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResumeFailed(f"{url}/tokenize answered something other than tokens: {exc}") from None
    max_model_len = answer.get("max_model_len")
    return tokens, max_model_len if isinstance(max_model_len, int) else None


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, until `[DONE]`."""
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data


async def events(content: aiohttp.StreamReader, *, num_resumed: int = 0) -> AsyncIterator[dict]:
    """Tandem's worker events from vLLM's stream: start (prompt tokens), token (text, token ids) per chunk that
    carries some, then done (finish reason, prompt and completion tokens; a resumed request's earlier tokens counted
    in the completion, not the prompt) or error. Raises ValueError on a chunk that is not JSON."""
    started = False
    finish_reason = None
    usage: dict = {}
    async for data in _sse_data(content):
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError(f"a chunk that is not an object: {data[:200]}")
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": chunk["error"]}
            yield {"type": "error", "kind": "engine", "message": str(error.get("message"))}
            return
        usage = chunk.get("usage") or usage
        if not started and usage:
            started = True
            yield {"type": "start", "prompt_tokens": int(usage.get("prompt_tokens") or 0) - num_resumed}
        for choice in chunk.get("choices") or ():
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content") or ""
            token_ids = list(choice.get("token_ids") or ())
            if text or token_ids:
                yield {"type": "token", "text": text, "token_ids": token_ids}
            if choice.get("finish_reason"):
                finish_reason = choice["finish_reason"]
    if finish_reason == "abort":
        yield {"type": "error", "kind": "drain", "message": "vLLM aborted the request (its worker is shutting down)"}
        return
    if finish_reason is None:
        return  # the stream ended without finishing: the relay treats it as a worker that went away
    yield {"type": "done", "finish_reason": finish_reason,
           "prompt_tokens": int(usage.get("prompt_tokens") or 0) - num_resumed,
           "completion_tokens": int(usage.get("completion_tokens") or 0) + num_resumed}
