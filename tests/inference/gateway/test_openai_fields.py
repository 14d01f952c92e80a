"""Every OpenAI field the gateway accepts takes effect, colocated and prefill -> decode; every other field answers 400
naming it. A client never believes that a setting took effect when it did not (docs/openai-api.md)."""
from __future__ import annotations

import json

import openai
import pytest
import requests
from transformers import AutoTokenizer

from tests.inference.gateway.support import PLAIN_FLEET, shared_workers, start_gateway, stop_all

pytestmark = pytest.mark.integration

MODES = ("colocated", "disaggregated")
PROMPT = "Once upon a time"
GREEDY = {"model": "tandem", "prompt": PROMPT, "temperature": 0, "ignore_eos": True}
CHAT = {"model": "tandem", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def gateways(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-openai-fields")
    started = [start_gateway("gateway-colocated", ["--colocated", workers["colocated"].url], log_dir),
               start_gateway("gateway-disaggregated", ["--prefill", workers["prefill"].url,
                                                       "--decode", workers["decode"].url], log_dir)]
    yield dict(zip(MODES, (g.url for g in started)))
    stop_all(started)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def first_token(gateways, tokenizer) -> int:
    """The greedy first token of PROMPT: the model ranks it high, so a +100 bias on it wins every step."""
    text = _text(gateways["colocated"], max_tokens=1)
    (token_id,) = tokenizer.encode(text)
    return token_id


def _post(url: str, body: dict, path: str = "/v1/completions") -> requests.Response:
    return requests.post(url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=60)


def _text(url: str, **fields) -> str:
    resp = _post(url, {**GREEDY, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def _refused(resp: requests.Response, param: str) -> dict:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and param in error["message"]
    return error


@pytest.mark.parametrize("mode", MODES)
def test_logit_bias_changes_the_text(gateways, tokenizer, first_token, mode):
    url = gateways[mode]
    plain = _text(url, max_tokens=8)
    assert _text(url, max_tokens=8, logit_bias={str(first_token): 100}) == tokenizer.decode([first_token] * 8)
    banned = _text(url, max_tokens=8, logit_bias={str(first_token): -100})
    assert banned != plain and tokenizer.encode(banned)[0] != first_token


@pytest.mark.parametrize("mode", MODES)
def test_penalties_change_the_text_after_the_first_token(gateways, first_token, mode):
    # The bias makes the first token repeat; the penalties count those repeats on the decode worker too.
    url = gateways[mode]
    bias = {str(first_token): 60}
    biased = _text(url, max_tokens=24, logit_bias=bias)
    penalized = _text(url, max_tokens=24, logit_bias=bias, presence_penalty=2, frequency_penalty=2)
    assert penalized != biased
    assert penalized == _text(gateways["colocated"], max_tokens=24, logit_bias=bias, presence_penalty=2,
                              frequency_penalty=2)


@pytest.mark.parametrize("mode", MODES)
def test_a_bias_on_a_token_the_model_lacks_is_400_from_the_worker(gateways, mode):
    error = _refused(_post(gateways[mode], {**GREEDY, "logit_bias": {"4096": 1}}), "logit_bias")
    assert "4096" in error["message"]


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "frobnicate", 1),
    ("/v1/completions", "max_completion_tokens", 5),  # a chat field; the legacy endpoint ignored it before
    ("/v1/completions", "response_format", {"type": "text"}),
    ("/v1/completions", "logprobs", 0),  # the chosen tokens' log probabilities; 0 == False passed before
    ("/v1/chat/completions", "top_logprobs", 2),
    ("/v1/chat/completions", "frobnicate", None),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("/v1/chat/completions", "tool_choice", "auto"),
    ("/v1/chat/completions", "tool_choice", "none"),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("/v1/chat/completions", "functions", [{"name": "f", "parameters": {}}]),
    ("/v1/chat/completions", "function_call", "auto"),
    ("/v1/chat/completions", "parallel_tool_calls", False),
    ("/v1/chat/completions", "store", True),
])
def test_a_field_the_gateway_does_not_honour_is_400_naming_it(gateways, path, field, value):
    body = {**(CHAT if "chat" in path else {**GREEDY, "max_tokens": 2}), field: value}
    _refused(_post(gateways["colocated"], body, path), field)


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 2.5), ("presence_penalty", "high"), ("frequency_penalty", -2.1),
    ("logit_bias", {"1": 101}), ("logit_bias", {"one": 5}), ("logit_bias", {str(i): 1 for i in range(301)}),
])
def test_an_out_of_range_setting_is_400_naming_it(gateways, field, value):
    _refused(_post(gateways["colocated"], {**GREEDY, field: value}), field)


@pytest.mark.parametrize("field, value", [
    ("response_format", {"type": "text"}), ("tools", []), ("tools", None), ("tool_choice", None),
    ("logit_bias", {}), ("presence_penalty", 0), ("frequency_penalty", None),
])
def test_a_setting_that_asks_for_nothing_is_accepted(gateways, field, value):
    assert _post(gateways["colocated"], {**CHAT, field: value}, "/v1/chat/completions").status_code == 200


def test_the_openai_client_gets_its_bias_and_its_refusals(gateways, tokenizer, first_token):
    client = openai.OpenAI(base_url=gateways["disaggregated"] + "/v1", api_key="unused", max_retries=0, timeout=60)
    result = client.completions.create(model="tandem", prompt=PROMPT, max_tokens=4, temperature=0,
                                       logit_bias={str(first_token): 100}, extra_body={"ignore_eos": True})
    assert result.choices[0].text == tokenizer.decode([first_token] * 4)
    chat = dict(model="tandem", messages=[{"role": "user", "content": "Hello"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**chat, response_format={"type": "json_object"})
    assert refused.value.param == "response_format"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**chat, tool_choice="none")
    assert refused.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**chat, frequency_penalty=3)
    assert refused.value.param == "frequency_penalty"
