"""A decode worker refuses every bad KV payload with a 400 that says what is wrong, and stays healthy.

The good payload is built here from Hugging Face's own cache (not by a prefill worker), so this also checks that the
wire format means what the contract says: post-RoPE K and V, [num_layers, num_prompt_tokens, num_kv_heads, head_dim].
"""
from __future__ import annotations

import json
import time

import pytest
import requests
import torch
from safetensors.torch import save as st_save
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.kv_wire import KVPayload, encode_payload
from tests.inference.test_kv_wire import signed_save
from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, assert_openai_error, metric, read_stream, start_worker, token_ids)

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def decode(tiny_model_dir, tmp_path_factory):
    proc = start_worker("decode", "decode", tiny_model_dir, tmp_path_factory.mktemp("logs"), "--revision", "7",
                        "--max-num-seqs", "1", "--max-queue", "1", "--stream-claim-timeout", "10")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """HF's prompt K/V, first token and greedy continuation for PROMPT."""
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        cache = out.past_key_values
        # each layer: [1, num_kv_heads, num_prompt_tokens, head_dim] -> [num_prompt_tokens, num_kv_heads, head_dim]
        k = torch.stack([layer.keys[0].transpose(0, 1) for layer in cache.layers])  # [L, S, Hkv, D]
        v = torch.stack([layer.values[0].transpose(0, 1) for layer in cache.layers])  # [L, S, Hkv, D]
        greedy = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(ids):].tolist()
    first = int(out.logits[0, -1].argmax())
    assert first == greedy[0]
    layout = {"num_layers": k.shape[0], "num_kv_heads": k.shape[2], "head_dim": k.shape[3], "dtype": "float32",
              "block_size": 16}
    return {"ids": ids, "k": k.contiguous(), "v": v.contiguous(), "first": first, "greedy": greedy,
            "layout": layout}


def good_payload(reference, request_id: str, **overrides) -> KVPayload:
    fields = dict(request_id=request_id, prompt_token_ids=reference["ids"], first_token_id=reference["first"],
                  sampling={"max_tokens": MAX_TOKENS, "temperature": 0.0, "stop": []},
                  kv_layout=reference["layout"], revision="7", k=reference["k"], v=reference["v"])
    fields.update(overrides)
    return KVPayload(**fields)


def post_kv(url: str, data: bytes) -> requests.Response:
    return requests.post(f"{url}/v1/kv", data=data, timeout=HTTP_TIMEOUT_S,
                         headers={"Content-Type": "application/octet-stream"})


def stream(url: str, request_id: str) -> list[dict]:
    with requests.get(f"{url}/v1/stream/{request_id}", stream=True, timeout=HTTP_TIMEOUT_S) as r:
        return read_stream(r)


def test_a_payload_built_from_hf_cache_decodes_to_hf_greedy_tokens(decode, reference):
    r = post_kv(decode.url, encode_payload(good_payload(reference, "good-1")))
    assert r.status_code == 200, r.text
    assert r.json() == {"request_id": "good-1", "accepted": True, "prompt_tokens": len(reference["ids"])}
    events = stream(decode.url, "good-1")
    assert [reference["first"], *token_ids(events)] == reference["greedy"]


def _deep_header(reference) -> bytes:
    """A payload whose `tandem` header nests 5,000 levels (json.loads raised RecursionError on it: a 500)."""
    header = json.dumps(good_payload(reference, "deep").header())
    deep = header[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    return st_save({"k": reference["k"], "v": reference["v"]}, metadata={"tandem": deep})  # refused before its checksum


@pytest.mark.parametrize("case", ["garbage", "truncated", "wrong_shape", "wrong_dtype", "wrong_layout",
                                  "wrong_revision", "out_of_vocab", "too_long", "bad_sampling", "no_header",
                                  "bad_request_id", "deep_header", "bad_resumed_count", "corrupted"])
def test_a_bad_payload_answers_400_and_the_worker_stays_healthy(decode, reference, case):
    good = encode_payload(good_payload(reference, f"bad-{case}"))
    num_tokens = len(reference["ids"])
    data, fragment = {
        "garbage": lambda: (b"\x00\x01 definitely not safetensors" * 10, "not fit"),
        "truncated": lambda: (good[:len(good) - 100], "corrupt"),
        "wrong_shape": lambda: (encode_payload(good_payload(
            reference, "x", k=reference["k"][:, :-1], v=reference["v"][:, :-1])), f"expected [4, {num_tokens}, 2, 48]"),
        # Tensors of another dtype than the header's layout names (encode_payload converts, so a sender's own).
        "wrong_dtype": lambda: (signed_save({"k": reference["k"].half(), "v": reference["v"].half()},
                                            good_payload(reference, "x").header()), "dtype float16"),
        "wrong_layout": lambda: (encode_payload(good_payload(
            reference, "x", kv_layout={**reference["layout"], "num_kv_heads": 4})), "mismatch on num_kv_heads"),
        "wrong_revision": lambda: (encode_payload(good_payload(reference, "x", revision="6")), "revision"),
        "out_of_vocab": lambda: (encode_payload(good_payload(reference, "x", first_token_id=10**6)), "vocabulary"),
        "too_long": lambda: (encode_payload(good_payload(reference, "x", sampling={"max_tokens": 5000})),
                             "maximum context length is 1024"),
        "bad_sampling": lambda: (encode_payload(good_payload(reference, "x", sampling={"temperature": "hot"})),
                                 "temperature"),
        "no_header": lambda: (st_save({"k": reference["k"], "v": reference["v"]}), "no 'tandem' metadata"),
        "bad_request_id": lambda: (encode_payload(good_payload(reference, "has spaces/and slashes")), "request_id"),
        "deep_header": lambda: (_deep_header(reference), "deeper than 32 levels"),
        "bad_resumed_count": lambda: (encode_payload(good_payload(
            reference, "x", extra={"num_resumed_tokens": num_tokens})), "num_resumed_tokens"),
        "corrupted": lambda: (good[:-5] + bytes([good[-5] ^ 0x01]) + good[-4:], "checksum mismatch"),
    }[case]()
    error = assert_openai_error(post_kv(decode.url, data), 400, fragment)
    # Only a corrupted push has the code that makes the prefill worker push it again.
    assert (error["code"] == "kv_checksum_mismatch") == (case in ("corrupted", "truncated"))
    assert requests.get(f"{decode.url}/health", timeout=HTTP_TIMEOUT_S).status_code == 200


def test_a_body_larger_than_any_kv_of_this_model_is_refused_with_413(decode):
    # The largest real payload: 1024 tokens x 2 x 4 layers x 2 heads x 48 x 4 bytes = 3 MiB, plus its header.
    too_big = b"\0" * (6 << 20)
    assert_openai_error(post_kv(decode.url, too_big), 413, "exceeds the limit")
    chunked = requests.post(f"{decode.url}/v1/kv", data=iter([too_big[:1 << 20]] * 6), timeout=HTTP_TIMEOUT_S,
                            headers={"Content-Type": "application/octet-stream"})
    assert_openai_error(chunked, 413, "exceeds the limit")


def test_after_all_the_bad_payloads_a_good_one_still_works_and_nothing_leaked(decode, reference):
    r = post_kv(decode.url, encode_payload(good_payload(reference, "good-2")))
    assert r.status_code == 200, r.text
    assert [reference["first"], *token_ids(stream(decode.url, "good-2"))] == reference["greedy"]
    assert metric(decode.url, "tandem_requests_running") == 0
    assert metric(decode.url, "tandem_kv_cache_usage_ratio") == 0
    assert metric(decode.url, "tandem_prefill_tokens_computed_total") == 0
    assert metric(decode.url, "tandem_request_errors_total", kind="invalid_request") >= 11


def test_a_duplicate_request_id_in_flight_is_refused_with_409(decode, reference):
    data = encode_payload(good_payload(reference, "dup-1"))
    assert post_kv(decode.url, data).status_code == 200
    assert_openai_error(post_kv(decode.url, data), 409, "dup-1")
    stream(decode.url, "dup-1")
    assert_openai_error(requests.get(f"{decode.url}/v1/stream/dup-1", timeout=HTTP_TIMEOUT_S), 404)


def test_a_header_naming_extra_tensors_is_refused(decode, reference):
    header = good_payload(reference, "extra-1").header()
    data = signed_save({"k": reference["k"], "v": reference["v"], "evil": torch.zeros(1)}, header)
    assert_openai_error(post_kv(decode.url, data), 400, "exactly the tensors")


def test_a_full_decode_worker_answers_429_with_retry_after_until_its_requests_are_streamed(decode, reference):
    # Received but not yet streamed requests count: --max-num-seqs 1 + --max-queue 1 = 2 in flight.
    for request_id in ("full-1", "full-2"):
        assert post_kv(decode.url, encode_payload(good_payload(reference, request_id))).status_code == 200
    refused = post_kv(decode.url, encode_payload(good_payload(reference, "full-3")))
    error = assert_openai_error(refused, 429, "full")
    assert error["code"] == "queue_full" and int(refused.headers["Retry-After"]) >= 1
    for request_id in ("full-1", "full-2"):
        assert [reference["first"], *token_ids(stream(decode.url, request_id))] == reference["greedy"]
    assert post_kv(decode.url, encode_payload(good_payload(reference, "full-3"))).status_code == 200
    stream(decode.url, "full-3")


def test_a_request_nobody_streams_is_aborted_after_the_claim_timeout(decode, reference):
    num_timeouts = metric(decode.url, "tandem_request_errors_total", kind="timeout")
    assert post_kv(decode.url, encode_payload(good_payload(reference, "orphan-1"))).status_code == 200
    deadline = time.monotonic() + 60
    while metric(decode.url, "tandem_request_errors_total", kind="timeout") == num_timeouts:
        assert time.monotonic() < deadline, "the unclaimed request was never aborted"
        time.sleep(0.1)
    assert_openai_error(requests.get(f"{decode.url}/v1/stream/orphan-1", timeout=HTTP_TIMEOUT_S), 404)
    assert metric(decode.url, "tandem_kv_cache_usage_ratio") == 0


def test_a_stream_client_that_hangs_up_aborts_the_request_and_frees_its_blocks(decode, reference):
    num_disconnects = metric(decode.url, "tandem_request_errors_total", kind="client_disconnect")
    num_tokens_before = metric(decode.url, "tandem_generation_tokens_total")
    long = good_payload(reference, "hangup-1", sampling={"max_tokens": 900, "ignore_eos": True})
    assert post_kv(decode.url, encode_payload(long)).status_code == 200
    r = requests.get(f"{decode.url}/v1/stream/hangup-1", stream=True, timeout=HTTP_TIMEOUT_S)
    lines = r.iter_lines()
    assert json.loads(next(lines))["type"] == "start"
    assert json.loads(next(lines))["type"] == "token"
    r.close()
    deadline = time.monotonic() + 30
    while metric(decode.url, "tandem_kv_cache_usage_ratio") > 0:
        assert time.monotonic() < deadline, "the abandoned request kept its blocks"
        time.sleep(0.05)
    assert metric(decode.url, "tandem_request_errors_total", kind="client_disconnect") == num_disconnects + 1
    # Stopped early, not run to its 900 tokens.
    assert metric(decode.url, "tandem_generation_tokens_total") - num_tokens_before < 800
