"""Every bad input answers a 4xx in OpenAI's error shape, naming what is wrong; none answers a 500."""
from __future__ import annotations

import json

import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, shared_workers, start_gateway

pytestmark = pytest.mark.integration

MAX_BODY_BYTES = 8192


@pytest.fixture(scope="module")
def gateway_url(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    gateway = start_gateway("gateway", ["--colocated", workers["colocated"].url,
                                        "--max-body-bytes", str(MAX_BODY_BYTES)],
                            tmp_path_factory.mktemp("gateway-bad-input"))
    yield gateway.url
    gateway.stop()


def _post(url: str, path: str, data) -> requests.Response:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return requests.post(url + path, data=raw, headers={"Content-Type": "application/json"}, timeout=30)


def _error(resp: requests.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


def test_malformed_json_is_400(gateway_url):
    error = _error(_post(gateway_url, "/v1/completions", b'{"model": "tandem", "prompt": '), 400)
    assert error["code"] == "invalid_json"


def test_a_body_that_is_not_an_object_is_400(gateway_url):
    assert "object" in _error(_post(gateway_url, "/v1/completions", b'["tandem"]'), 400)["message"]


@pytest.mark.parametrize("param,value", [
    ("max_tokens", "8"), ("max_tokens", 2.5), ("max_tokens", True), ("temperature", "hot"), ("top_p", [1]),
    ("top_k", 1.5), ("seed", "42"), ("stop", 7), ("stop", ["ok", 3]), ("stream", "yes"), ("model", 3),
    ("prompt", 123), ("prompt", ["a", "b"]), ("prompt", [1, 2, 3]),
])
def test_a_wrong_type_is_400_naming_the_param(gateway_url, param, value):
    body = {"model": "tandem", "prompt": "hello", param: value}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == param


@pytest.mark.parametrize("param,value", [("temperature", 5), ("top_p", 0), ("top_k", -2)])
def test_an_out_of_range_value_is_400_naming_the_param(gateway_url, param, value):
    body = {"model": "tandem", "prompt": "hello", param: value}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == param


@pytest.mark.parametrize("prompt", ["", [""]])
def test_an_empty_prompt_is_400(gateway_url, prompt):
    body = {"model": "tandem", "prompt": prompt}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == "prompt"


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_below_one_is_400(gateway_url, max_tokens):
    body = {"model": "tandem", "prompt": "hello", "max_tokens": max_tokens}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == "max_tokens"


def test_n_other_than_one_is_400(gateway_url):
    body = {"model": "tandem", "prompt": "hello", "n": 2}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == "n"


def test_an_unknown_model_is_404_model_not_found(gateway_url):
    error = _error(_post(gateway_url, "/v1/completions", {"model": "gpt-4", "prompt": "hello"}), 404)
    assert error["code"] == "model_not_found" and "gpt-4" in error["message"]


def test_a_body_over_the_limit_is_413(gateway_url):
    body = {"model": "tandem", "prompt": "x" * (MAX_BODY_BYTES + 1)}
    assert _error(_post(gateway_url, "/v1/completions", body), 413)["code"] == "request_too_large"


@pytest.mark.parametrize("stream", [False, True])
def test_a_context_overflow_comes_back_from_the_worker_naming_both_numbers(gateway_url, stream):
    # --max-model-len 512 (support.WORKER_ARGS): 300 words is about 300+ tokens, plus 400 to generate.
    body = {"model": "tandem", "prompt": "word " * 300, "max_tokens": 400, "stream": stream}
    error = _error(_post(gateway_url, "/v1/completions", body), 400)
    assert "512" in error["message"] and "400" in error["message"]


@pytest.mark.parametrize("messages,param", [
    ("hello", "messages"), ([], "messages"), (["hello"], "messages[0]"),
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content"),
])
def test_bad_chat_messages_are_400_naming_the_message(gateway_url, messages, param):
    body = {"model": "tandem", "messages": messages}
    assert _error(_post(gateway_url, "/v1/chat/completions", body), 400)["param"] == param


def test_max_completion_tokens_is_checked_in_chat(gateway_url):
    body = {"model": "tandem", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}
    assert _error(_post(gateway_url, "/v1/chat/completions", body), 400)["param"] == "max_completion_tokens"


def test_stream_options_without_stream_is_400(gateway_url):
    body = {"model": "tandem", "prompt": "hi", "stream_options": {"include_usage": True}}
    assert _error(_post(gateway_url, "/v1/completions", body), 400)["param"] == "stream_options"


@pytest.mark.parametrize("raw", [b"", b"null", b"\xff\xfe", b'{"model": "tandem", "prompt": "hi", "stop": {"a": 1}}',
                                 b'{"model": "tandem", "prompt": "hi", "max_tokens": 1e400}',
                                 b'{"model": "tandem", "prompt": "hi", "stream_options": 1, "stream": true}'])
def test_odd_bodies_are_4xx_never_5xx(gateway_url, raw):
    for path in ("/v1/completions", "/v1/chat/completions"):
        resp = _post(gateway_url, path, raw)
        assert 400 <= resp.status_code < 500, resp.text
        assert resp.json()["error"]["message"]


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/completions", b'{"model": "tandem", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", b'{"model": "tandem", "prompt": ["\\udc00"]}', "prompt[0]"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "hi", "stop": ["\\ud800"]}', "stop[0]"),
    ("/v1/completions", b'{"model": "tandem", "prompt": "hi", "user": "\\ud800"}', "user"),
    ("/v1/chat/completions", b'{"model": "tandem", "messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages[0].content"),
    ("/v1/chat/completions",
     b'{"model": "tandem", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages[0].content[0].text"),
])
def test_text_with_a_lone_surrogate_is_400_naming_the_field(gateway_url, path, raw, param):
    # It reached the worker's tokenizer, which raised: a 500 that took the worker out of rotation.
    error = _error(_post(gateway_url, path, raw), 400)
    assert (error["param"], error["code"]) == (param, "invalid_unicode")


def test_an_escaped_emoji_is_text_like_any_other(gateway_url):
    body = b'{"model": "tandem", "prompt": "\\ud83d\\ude00 and \\\\ud800 as plain text", "max_tokens": 2}'
    resp = _post(gateway_url, "/v1/completions", body)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("depth", [33, 3000])
def test_json_nested_deeper_than_32_levels_is_400(gateway_url, depth):
    # 3,000 levels made json.loads raise RecursionError: a 500.
    raw = b'{"model": "tandem", "prompt": "hi", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    for path in ("/v1/completions", "/v1/chat/completions"):
        error = _error(_post(gateway_url, path, raw), 400)
        assert error["code"] == "json_too_deep" and "32" in error["message"]


def test_an_unknown_route_and_a_wrong_method_answer_openai_errors(gateway_url):
    assert _error(requests.get(gateway_url + "/v1/nothing", timeout=5), 404)["code"] == "not_found"
    _error(requests.get(gateway_url + "/v1/completions", timeout=5), 405)
