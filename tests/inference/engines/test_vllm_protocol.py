"""The gateway's side of a vLLM worker: a Tandem worker body becomes vLLM's streaming request (a resumed one: the
worker's tokenization of the prompt plus the tokens already sent, asking only for those still owed), and vLLM's
chunks become Tandem's worker events, a resumed request's earlier tokens counted in its completion."""
from __future__ import annotations

import asyncio
import json

from inference.engines.vllm.protocol import events, request_for

BODY = {"prompt": "Hello", "messages": None, "max_tokens": 10, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
        "seed": None, "ignore_eos": False, "stop": ["\n\n"], "logit_bias": {}, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "cache_salt": "acme", "priority": "batch"}


def test_a_prompt_streams_from_completions_with_token_ids_and_usage_on_every_chunk():
    path, payload = request_for(BODY, "demo")
    assert path == "/v1/completions"
    assert payload["prompt"] == "Hello" and payload["max_tokens"] == 10 and payload["model"] == "demo"
    assert payload["return_token_ids"] and payload["stream_options"]["continuous_usage_stats"]
    assert payload["stop"] == ["\n\n"] and payload["cache_salt"] == "acme" and "priority" not in payload


def test_messages_go_to_chat_completions_and_a_null_max_tokens_means_the_rest_of_the_context():
    path, payload = request_for({**BODY, "prompt": None, "messages": [{"role": "user", "content": "Hi"}],
                                 "max_tokens": None}, "demo")
    assert path == "/v1/chat/completions" and "max_completion_tokens" not in payload and "max_tokens" not in payload


def test_a_resumed_request_sends_prompt_and_sent_tokens_as_ids_and_asks_for_the_rest():
    resumed = {**BODY, "resume_token_ids": [7, 8, 9]}
    path, payload = request_for(resumed, "demo", prompt_ids=[1, 2], max_model_len=512)
    assert path == "/v1/completions" and payload["prompt"] == [1, 2, 7, 8, 9] and payload["max_tokens"] == 7
    chat = {**resumed, "prompt": None, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": None}
    assert request_for(chat, "demo", prompt_ids=[1, 2], max_model_len=512)[1]["max_tokens"] == 512 - 2 - 3


class _Lines:
    def __init__(self, chunks):
        self.lines = [f"data: {json.dumps(c)}\n".encode() for c in chunks] + [b"\n", b"data: [DONE]\n"]

    def __aiter__(self):
        async def lines():
            for line in self.lines:
                yield line
        return lines()


def _events(chunks, num_resumed=0):
    async def collect():
        return [e async for e in events(_Lines(chunks), num_resumed=num_resumed)]
    return asyncio.run(collect())


def test_chunks_become_start_token_and_done_events_with_resumed_tokens_in_the_completion():
    usage = {"prompt_tokens": 5, "completion_tokens": 1}
    got = _events([{"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": usage},
                   {"choices": [{"delta": {"content": "Hi"}, "token_ids": [42]}], "usage": usage},
                   {"choices": [{"delta": {"content": "!"}, "token_ids": [43], "finish_reason": "stop"}],
                    "usage": {**usage, "completion_tokens": 2}},
                   {"choices": [], "usage": {**usage, "completion_tokens": 2}}], num_resumed=3)
    assert got == [{"type": "start", "prompt_tokens": 2},
                   {"type": "token", "text": "Hi", "token_ids": [42]},
                   {"type": "token", "text": "!", "token_ids": [43]},
                   {"type": "done", "finish_reason": "stop", "prompt_tokens": 2, "completion_tokens": 5}]


def test_a_request_vllm_aborts_while_draining_moves_on_and_an_unfinished_stream_ends_without_done():
    usage = {"prompt_tokens": 5, "completion_tokens": 1}
    aborted = _events([{"choices": [{"text": "a", "token_ids": [1], "finish_reason": "abort"}], "usage": usage}])
    assert aborted[-1] == {"type": "error", "kind": "drain",
                           "message": "vLLM aborted the request (its worker is shutting down)"}
    cut = _events([{"choices": [{"text": "a", "token_ids": [1]}], "usage": usage}])
    assert [e["type"] for e in cut] == ["start", "token"]
