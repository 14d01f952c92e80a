"""Workers say which dtype they run (/info, /health, tandem_worker_info), and the KV handoff never crosses dtypes
unawares: a float32 prefill worker's KV is refused by a bfloat16 decode worker with a 400 naming both, which stays
healthy, unless the request names the decode worker's dtype (decode_kv_dtype, as the gateway does): then the prefill
worker converts its KV to it before the push, and stages run different dtypes."""
from __future__ import annotations

import pytest
import requests

from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, START_TIMEOUT_S, assert_openai_error, metric, read_stream, start_worker, token_ids)
from tests.procs import wait_http

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    """The tiny model (saved in float32): a prefill worker on auto (float32), a prefill and a decode worker in
    bfloat16, a float32 decode worker with a float16 KV cache."""
    log_dir = tmp_path_factory.mktemp("logs")
    started = {}
    try:
        started["prefill_auto"] = start_worker("prefill-auto", "prefill", tiny_model_dir, log_dir, wait=False)
        for name, role in (("prefill_bf16", "prefill"), ("decode_bf16", "decode")):
            started[name] = start_worker(name, role, tiny_model_dir, log_dir, "--dtype", "bfloat16", wait=False)
        started["decode_kv16"] = start_worker("decode-kv16", "decode", tiny_model_dir, log_dir,
                                              "--kv-cache-dtype", "float16", wait=False)
        for proc in started.values():
            wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S)
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _get(url: str, path: str) -> dict:
    r = requests.get(url + path, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_info_and_health_say_what_runs_and_what_was_asked(workers):
    auto = _get(workers["prefill_auto"].url, "/info")
    assert (auto["dtype"], auto["dtype_requested"], auto["kv_layout"]["dtype"]) == ("float32", "auto", "float32")
    bf16 = _get(workers["decode_bf16"].url, "/info")
    assert (bf16["dtype"], bf16["dtype_requested"], bf16["kv_layout"]["dtype"]) == ("bfloat16", "bfloat16",
                                                                                    "bfloat16")
    assert _get(workers["decode_bf16"].url, "/health")["dtype"] == "bfloat16"
    assert _get(workers["prefill_auto"].url, "/health")["dtype"] == "float32"
    # Why: the tiny model is saved in float32; bfloat16 was asked for (with a note where this CPU lacks BF16).
    assert auto["dtype_reason"] == "auto: the model's own dtype"
    assert bf16["dtype_reason"].startswith("asked for")


def test_the_info_metric_carries_the_dtype(workers):
    url = workers["prefill_auto"].url
    assert metric(url, "tandem_worker_info", dtype="float32", dtype_requested="auto", role="prefill") == 1
    assert metric(url, "tandem_worker_info", dtype="bfloat16") == 0


def test_a_float32_prefill_never_feeds_a_bfloat16_decode(workers):
    decode = workers["decode_bf16"].url
    r = requests.post(f"{workers['prefill_auto'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"request_id": "cross-1", "prompt": PROMPT, "max_tokens": 6, "decode_url": decode})
    error = assert_openai_error(r, 502, "HTTP 400", "KV dtype mismatch", "'float32'", "'bfloat16'")
    assert error["code"] == "decode_rejected"
    assert _get(decode, "/health")["status"] == "ok"
    assert metric(decode, "tandem_requests_running") == 0 and metric(decode, "tandem_kv_cache_usage_ratio") == 0
    assert metric(decode, "tandem_request_errors_total", kind="invalid_request") >= 1
    assert_openai_error(requests.get(f"{decode}/v1/stream/cross-1", timeout=HTTP_TIMEOUT_S), 404)


def test_the_decode_worker_still_takes_kv_of_its_own_dtype(workers):
    decode = workers["decode_bf16"].url
    r = requests.post(f"{workers['prefill_bf16'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"request_id": "same-1", "prompt": PROMPT, "max_tokens": 6, "decode_url": decode})
    assert r.status_code == 200, r.text
    with requests.get(f"{decode}/v1/stream/same-1", stream=True, timeout=HTTP_TIMEOUT_S) as s:
        events = read_stream(s)
    assert len([r.json()["first_token_id"], *token_ids(events)]) == 6
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "length"


def test_a_float32_prefill_told_the_decode_dtype_converts_its_kv_and_the_request_completes(workers):
    decode = workers["decode_bf16"].url
    answers = {}
    for name, prefill, extra in (("converted", "prefill_auto", {"decode_kv_dtype": "bfloat16"}),
                                 ("native", "prefill_bf16", {})):
        r = requests.post(f"{workers[prefill].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                          json={"request_id": f"conv-{name}", "prompt": PROMPT, "max_tokens": 6,
                                "decode_url": decode, **extra})
        assert r.status_code == 200, r.text
        answers[name] = r.json()
        with requests.get(f"{decode}/v1/stream/conv-{name}", stream=True, timeout=HTTP_TIMEOUT_S) as s:
            events = read_stream(s)
        assert len([answers[name]["first_token_id"], *token_ids(events)]) == 6
        assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "length"
    # The converted payload is a bfloat16 one: the size of the native bfloat16 prefill's (half of float32's).
    assert abs(answers["converted"]["kv_bytes"] - answers["native"]["kv_bytes"]) < 64, answers


def test_an_unknown_decode_kv_dtype_is_a_400_naming_the_field(workers):
    r = requests.post(f"{workers['prefill_auto'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"prompt": PROMPT, "max_tokens": 2, "decode_url": workers["decode_bf16"].url,
                            "decode_kv_dtype": "int4"})
    error = assert_openai_error(r, 400, "decode_kv_dtype must be one of float32, bfloat16, float16")
    assert error["param"] == "decode_kv_dtype"


def _serves_through_a_gateway(name: str, prefill: str, decode: str, tmp_path) -> None:
    """A gateway in front of the two workers completes a request (5 tokens)."""
    from tests.inference.gateway.support import start_gateway

    gateway = start_gateway(name, ["--prefill", prefill, "--decode", decode], tmp_path)
    try:
        r = requests.post(gateway.url + "/v1/completions", timeout=HTTP_TIMEOUT_S,
                          json={"model": "tandem", "prompt": PROMPT, "max_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
    finally:
        gateway.stop()


def test_a_gateway_in_front_of_a_float32_prefill_and_a_bfloat16_decode_serves(workers, tmp_path):
    """The gateway names the decode worker's dtype (from its /health) in every prefill request."""
    _serves_through_a_gateway("gateway-mixed", workers["prefill_auto"].url, workers["decode_bf16"].url, tmp_path)


def test_a_float16_kv_cache_beside_float32_is_said_and_a_gateway_feeds_it_converted_kv(workers, tmp_path):
    """A decode worker with --kv-cache-dtype float16 says it (/info, /health) and takes float16 KV only; the gateway
    names that dtype in each prefill request (from /health), so a float32 prefill worker converts its KV to it."""
    decode = workers["decode_kv16"].url
    info = _get(decode, "/info")
    assert (info["dtype"], info["kv_cache_dtype"], info["kv_layout"]["dtype"]) == ("float32", "float16", "float16")
    assert _get(decode, "/health")["kv_cache_dtype"] == "float16"
    assert _get(workers["prefill_auto"].url, "/health")["kv_cache_dtype"] == "float32"
    r = requests.post(f"{workers['prefill_auto'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"request_id": "kv16-1", "prompt": PROMPT, "max_tokens": 6, "decode_url": decode})
    assert_openai_error(r, 502, "HTTP 400", "KV dtype mismatch", "'float32'", "'float16'")
    _serves_through_a_gateway("gateway-kv16", workers["prefill_auto"].url, decode, tmp_path)
