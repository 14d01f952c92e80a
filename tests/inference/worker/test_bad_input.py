"""Bad requests get a 4xx in OpenAI's error shape that names the problem; none is a 500 or harms the worker."""
from __future__ import annotations

import pytest
import requests

from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, assert_openai_error, generate, metric, read_stream, start_worker, token_ids)

pytestmark = pytest.mark.integration

MAX_BODY = 4096


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    proc = start_worker("colocated", "colocated", tiny_model_dir, tmp_path_factory.mktemp("logs"),
                        "--max-body-bytes", str(MAX_BODY))
    yield proc
    proc.stop()


def post(url: str, path: str = "/v1/generate", **kwargs) -> requests.Response:
    return requests.post(f"{url}{path}", timeout=HTTP_TIMEOUT_S, **kwargs)


@pytest.mark.parametrize("raw, fragment", [
    (b"{not json", "not valid JSON"),
    (b"", "body is empty"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"[1, 2, 3]", "must be a JSON object"),
    (b'"just a string"', "must be a JSON object"),
])
def test_malformed_json_answers_400(worker, raw, fragment):
    assert_openai_error(post(worker.url, data=raw, headers={"Content-Type": "application/json"}), 400, fragment)


@pytest.mark.parametrize("body, param, fragment", [
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": 42}, "prompt", "must be a string"),
    ({}, "prompt", "exactly one"),
    ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "prompt", "exactly one"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "user"}]}, "messages[0]", "content"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens", ">= 1"),
    ({"prompt": "hi", "max_tokens": "16"}, "max_tokens", "integer"),
    ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens", "integer"),
    ({"prompt": "hi", "max_tokens": True}, "max_tokens", "integer"),
    ({"prompt": "hi", "temperature": "warm"}, "temperature", "number"),
    ({"prompt": "hi", "temperature": -1}, "temperature", "[0, 100]"),
    ({"prompt": "hi", "top_p": 0}, "top_p", "(0, 1]"),
    ({"prompt": "hi", "top_k": -1}, "top_k", ">= 0"),
    ({"prompt": "hi", "seed": "x"}, "seed", "integer"),
    ({"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos", "boolean"),
    ({"prompt": "hi", "stop": 5}, "stop", "string"),
    ({"prompt": "hi", "stop": [""]}, "stop", "1-256"),
    ({"prompt": "hi", "request_id": "a b/c"}, "request_id", "request_id"),
    ({"prompt": "hi", "logit_bias": {"4096": 1}}, "logit_bias", "vocabulary of 4096"),
    ({"prompt": "hi", "logit_bias": {"1": -100.5}}, "logit_bias", "[-100, 100]"),
    ({"prompt": "hi", "logit_bias": [1]}, "logit_bias", "object"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    ({"prompt": "hi", "frequency_penalty": "x"}, "frequency_penalty", "number"),
])
def test_wrong_values_answer_400_naming_the_parameter(worker, body, param, fragment):
    error = assert_openai_error(post(worker.url, json=body), 400, fragment)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw, param", [
    (b'{"prompt": "a\\ud800b"}', "prompt"),
    (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages[0].content"),
    (b'{"messages": [{"role": "\\ud800", "content": "hi"}]}', "messages[0].role"),
    (b'{"prompt": "hi", "stop": ["ok", "\\udbff"]}', "stop[1]"),
    (b'{"prompt": "hi", "stop": "\xed\xa0\x80"}', "stop"),  # a surrogate encoded in the bytes themselves
])
def test_text_with_a_lone_surrogate_answers_400_naming_the_field(worker, raw, param):
    # JSON can spell half a UTF-16 pair; the tokenizer raised on it (a 500) before.
    error = assert_openai_error(post(worker.url, data=raw, headers={"Content-Type": "application/json"}), 400,
                                "surrogate")
    assert (error["param"], error["code"]) == (param, "invalid_unicode")


@pytest.mark.parametrize("depth", [33, 1500])
def test_json_nested_deeper_than_32_levels_answers_400(worker, depth):
    # 1,500 levels made json.loads raise RecursionError (a 500); MAX_BODY keeps this body small enough.
    raw = b'{"prompt": "hi", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    error = assert_openai_error(post(worker.url, data=raw, headers={"Content-Type": "application/json"}), 400,
                                "deeper than 32 levels")
    assert error["code"] == "json_too_deep"


def test_the_prefill_route_refuses_them_alike(tiny_model_dir, tmp_path_factory):
    prefill = start_worker("prefill", "prefill", tiny_model_dir, tmp_path_factory.mktemp("logs"))
    try:
        body = {"prompt": "a\ud800b", "decode_url": "http://127.0.0.1:9"}
        error = assert_openai_error(post(prefill.url, "/v1/prefill", json=body), 400, "surrogate")
        assert error["param"] == "prompt"
        deep = b'{"prompt": "hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        assert_openai_error(post(prefill.url, "/v1/prefill", data=deep), 400, "deeper than 32 levels")
        assert metric(prefill.url, "tandem_request_errors_total", kind="internal") == 0
    finally:
        prefill.stop()


def test_json_nested_32_levels_deep_is_served(worker):
    raw = b'{"prompt": "hi", "max_tokens": 2, "x": ' + b"[" * 31 + b"]" * 31 + b"}"
    with requests.post(f"{worker.url}/v1/generate", data=raw, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        assert len(token_ids(read_stream(r))) == 2


def test_a_prompt_that_does_not_fit_names_both_numbers(worker):
    prompt = "word " * 200
    num_prompt_tokens = generate(worker.url, prompt=prompt, max_tokens=1)[0]["prompt_tokens"]
    error = assert_openai_error(post(worker.url, json={"prompt": prompt, "max_tokens": 1000}), 400,
                                f"the prompt has {num_prompt_tokens} tokens", "max_tokens is 1000", "1024")
    assert error["code"] == "context_length_exceeded"


def test_a_body_over_max_body_bytes_answers_413(worker):
    assert_openai_error(post(worker.url, json={"prompt": "x" * (MAX_BODY + 10)}), 413, str(MAX_BODY))


def test_unknown_routes_and_methods_answer_in_the_error_shape(worker):
    assert_openai_error(requests.get(f"{worker.url}/v1/nothing", timeout=HTTP_TIMEOUT_S), 404)
    assert_openai_error(requests.get(f"{worker.url}/v1/generate", timeout=HTTP_TIMEOUT_S), 405)
    # A colocated worker has no decode routes.
    assert_openai_error(post(worker.url, "/v1/kv", data=b"x"), 404)
    # Nor a fault hook: tests break a worker from outside it.
    assert_openai_error(post(worker.url, "/debug/fault", json={"kind": "die"}), 404)


def test_after_all_of_that_the_worker_is_healthy_and_serves(worker):
    assert requests.get(f"{worker.url}/health", timeout=HTTP_TIMEOUT_S).json()["status"] == "ok"
    events = generate(worker.url, prompt="Hello", max_tokens=3)
    assert len(token_ids(events)) == 3 and events[-1]["finish_reason"] == "length"
    assert metric(worker.url, "tandem_request_errors_total", kind="internal") == 0
    assert metric(worker.url, "tandem_request_errors_total", kind="invalid_request") > 20
