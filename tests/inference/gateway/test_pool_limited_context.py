"""Where a worker's KV pool holds less than the model's context, the fleet serves and advertises the context the
pool holds: a chat request without max_tokens ends with "length" there, and only a prompt that alone does not fit
is a 400."""
from __future__ import annotations

import json

import pytest
import requests

from tests.inference.gateway.support import start_gateway, start_workers, stop_all

pytestmark = pytest.mark.integration

# The tiny model in float32: 2 (K, V) x 4 layers x 16 tokens x 2 KV heads x 48 dims x 4 bytes = 49,152 bytes a block.
NUM_BYTES_PER_BLOCK = 49_152
NUM_BLOCKS = 8
POOL_CONTEXT = NUM_BLOCKS * 16  # 128 tokens, below the --max-model-len 512 of the test workers
SMALL_POOL = ["--kv-cache-bytes", str(NUM_BLOCKS * NUM_BYTES_PER_BLOCK), "--block-size", "16"]
FLEET = [("prefill-small-pool", "prefill"), ("decode-small-pool", "decode"), ("colocated-small-pool", "colocated")]


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    workers = start_workers(FLEET, tiny_model_dir, tmp_path_factory.mktemp("workers-small-pool"), SMALL_POOL)
    prefill, decode, colocated = workers
    gateway = start_gateway("gateway-small-pool", ["--prefill", prefill.url, "--decode", decode.url],
                            tmp_path_factory.mktemp("gateway-small-pool"))
    yield {"gateway": gateway.url, "prefill": prefill.url, "decode": decode.url, "colocated": colocated.url}
    stop_all([gateway, *workers])


def chat(url: str, **body) -> requests.Response:
    body = {"model": "tandem", "messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0,
            "ignore_eos": True, **body}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_workers_advertise_the_context_their_pool_holds(fleet):
    for role in ("prefill", "decode", "colocated"):
        info = requests.get(fleet[role] + "/info", timeout=10).json()
        assert (info["max_model_len"], info["configured_max_model_len"], info["num_kv_blocks"]) == (
            POOL_CONTEXT, 512, NUM_BLOCKS), role


def test_the_gateway_lists_the_context_the_pool_holds(fleet):
    (model,) = requests.get(fleet["gateway"] + "/v1/models", timeout=10).json()["data"]
    assert model["max_model_len"] == POOL_CONTEXT
    assert {w["max_model_len"] for w in model["workers"]} == {POOL_CONTEXT}


def test_a_chat_request_without_max_tokens_ends_with_length_where_the_pool_ends(fleet):
    resp = chat(fleet["gateway"])
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"] == POOL_CONTEXT


def test_max_tokens_beyond_the_pool_but_within_the_model_is_capped(fleet):
    resp = chat(fleet["gateway"], max_tokens=300)  # prompt + 300 < 512, the model's context here
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == POOL_CONTEXT


def test_a_colocated_worker_caps_a_null_max_tokens_to_its_pool(fleet):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": None, "ignore_eos": True}
    with requests.post(fleet["colocated"] + "/v1/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        events = [line for line in r.iter_lines() if line]
    last = json.loads(events[-1])
    assert last["finish_reason"] == "length"
    assert last["prompt_tokens"] + last["completion_tokens"] == POOL_CONTEXT


def test_a_prompt_longer_than_the_pool_context_is_a_400_naming_both_numbers(fleet):
    resp = chat(fleet["gateway"], messages=[{"role": "user", "content": "word " * 200}])
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "the prompt has " in error["message"] and f"a context of {POOL_CONTEXT} tokens" in error["message"]
