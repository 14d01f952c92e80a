"""The official openai client works against the gateway, streaming and not, for completions and chat."""
from __future__ import annotations

import openai
import pytest

from tests.inference.gateway.support import PLAIN_FLEET, shared_workers, start_gateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    gateway = start_gateway("gateway", ["--prefill", workers["prefill"].url, "--decode", workers["decode"].url,
                                        "--served-model-name", "tiny-chat"],
                            tmp_path_factory.mktemp("gateway-openai-client"))
    yield openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    gateway.stop()


def test_it_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["tiny-chat"]


def test_a_completion_has_openai_shape_and_usage(client):
    result = client.completions.create(model="tiny-chat", prompt="The license says", max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert result.object == "text_completion" and result.id.startswith("cmpl-")
    choice = result.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    assert result.usage.completion_tokens == 6
    assert result.usage.prompt_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + 6


def test_a_streamed_completion_equals_the_unstreamed_one(client):
    kwargs = dict(model="tiny-chat", prompt="def main():", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == whole
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_a_chat_completion_answers_as_the_assistant(client):
    result = client.chat.completions.create(
        model="tiny-chat", messages=[{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        max_completion_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    message = result.choices[0].message
    assert message.role == "assistant" and message.content
    assert result.choices[0].finish_reason == "length" and result.usage.completion_tokens == 5


def test_a_streamed_chat_sends_the_role_first_then_content(client):
    kwargs = dict(model="tiny-chat", messages=[{"role": "user", "content": "Write a haiku"}], max_tokens=7,
                  temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sampling_with_a_seed_is_reproducible(client):
    kwargs = dict(model="tiny-chat", prompt="Once upon a time", max_tokens=8, temperature=1.0, top_p=0.9, seed=7,
                  extra_body={"top_k": 50, "ignore_eos": True})
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_a_stop_string_ends_the_text_before_it(client):
    kwargs = dict(model="tiny-chat", prompt="The quick brown fox", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(**kwargs, stop=[stop], stream=True))
            text = "".join(c.choices[0].text for c in chunks)
            finish_reason = chunks[-1].choices[0].finish_reason
        else:
            choice = client.completions.create(**kwargs, stop=stop).choices[0]
            text, finish_reason = choice.text, choice.finish_reason
        assert text == full[:full.index(stop)]
        assert finish_reason == "stop"


def test_a_chat_without_max_tokens_may_run_to_the_end_of_the_context(client):
    # OpenAI's chat default: no limit but the model's context (the workers here run with --max-model-len 512).
    result = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "Go on."}],
                                            temperature=0, extra_body={"ignore_eos": True})
    assert result.choices[0].finish_reason == "length"
    assert result.usage.prompt_tokens + result.usage.completion_tokens == 512
