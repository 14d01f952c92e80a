"""Prefill worker -> KV push -> decode worker gives exactly Hugging Face's greedy tokens, and the colocated ones."""
from __future__ import annotations

import http.server
import json
import threading

import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, assert_openai_error, generate, metric, read_stream, text, token_ids,
    workers_started)
from tests.procs import free_port

pytestmark = pytest.mark.integration

PROMPTS = ["Hello world, this is", "def fibonacci(n):\n    ", "The license grants you the right to",
           "a"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    roles = ("prefill", "decode", "colocated")
    with workers_started(roles, tiny_model_dir, tmp_path_factory.mktemp("logs")) as started:
        yield started


@pytest.fixture(scope="module")
def hf_greedy(tiny_model_dir):
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    def run(prompt: str, max_new_tokens: int) -> list[int]:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, len(ids):].tolist()

    return run


def disaggregated(workers, request_id: str, **body) -> tuple[dict, list[dict]]:
    r = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"request_id": request_id, "decode_url": workers["decode"].url, **body})
    assert r.status_code == 200, r.text
    first = r.json()
    if first["finished"]:
        return first, []
    with requests.get(f"{workers['decode'].url}/v1/stream/{request_id}", stream=True, timeout=HTTP_TIMEOUT_S) as s:
        return first, read_stream(s)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_disaggregated_tokens_equal_hf_greedy_and_colocated(workers, hf_greedy, index):
    prompt = PROMPTS[index]
    first, events = disaggregated(workers, f"eq-{index}", prompt=prompt, max_tokens=MAX_TOKENS)
    tokens = [first["first_token_id"], *token_ids(events)]
    expected = hf_greedy(prompt, MAX_TOKENS)
    assert tokens == expected
    colocated = generate(workers["colocated"].url, prompt=prompt, max_tokens=MAX_TOKENS)
    assert token_ids(colocated) == expected
    assert first["text"] + text(events) == text(colocated)
    assert events[0] == {"type": "start", "request_id": f"eq-{index}", "prompt_tokens": first["prompt_tokens"]}
    assert events[-1]["type"] == "done" and events[-1]["completion_tokens"] == len(expected)
    assert first["kv_bytes"] > 0 and first["kv_transfer_seconds"] > 0


def test_chat_messages_use_the_template_on_both_paths(workers):
    messages = [{"role": "user", "content": "Say something."}]
    first, events = disaggregated(workers, "chat-1", messages=messages, max_tokens=6)
    colocated = generate(workers["colocated"].url, messages=messages, max_tokens=6)
    assert [first["first_token_id"], *token_ids(events)] == token_ids(colocated)
    assert first["prompt_tokens"] == colocated[0]["prompt_tokens"] > 8  # the template's tokens are there


def test_a_one_token_request_finishes_on_the_prefill_worker_without_a_push(workers, hf_greedy):
    first, events = disaggregated(workers, "one-1", prompt=PROMPTS[0], max_tokens=1)
    assert first["finished"] and first["finish_reason"] == "length" and first["kv_bytes"] == 0
    assert first["first_token_id"] == hf_greedy(PROMPTS[0], 1)[0]
    r = requests.get(f"{workers['decode'].url}/v1/stream/one-1", timeout=HTTP_TIMEOUT_S)
    assert_openai_error(r, 404, "one-1")


def test_decode_computes_no_prefill_tokens_and_both_sides_count_the_same_kv_bytes(workers):
    disaggregated(workers, "count-1", prompt=PROMPTS[2], max_tokens=3)
    prefill, decode = workers["prefill"].url, workers["decode"].url
    assert metric(decode, "tandem_prefill_tokens_computed_total") == 0
    assert metric(prefill, "tandem_prefill_tokens_computed_total") > 0
    assert metric(decode, "tandem_generation_tokens_total") > 0
    sent = metric(prefill, "tandem_kv_transfer_bytes_total", role="prefill", model="tiny")
    assert sent > 0 and sent == metric(decode, "tandem_kv_transfer_bytes_total", role="decode", model="tiny")
    assert metric(prefill, "tandem_kv_transfer_seconds_count") == metric(decode, "tandem_kv_transfer_seconds_count")


def test_info_announces_the_same_kv_layout_on_both_roles(workers):
    infos = {role: requests.get(f"{p.url}/info", timeout=HTTP_TIMEOUT_S).json() for role, p in workers.items()}
    assert infos["prefill"]["kv_layout"] == infos["decode"]["kv_layout"]
    assert infos["decode"]["kv_layout"] == {"num_layers": 4, "num_kv_heads": 2, "head_dim": 48, "dtype": "float32",
                                            "block_size": 16}
    assert infos["decode"]["role"] == "decode" and infos["decode"]["model"] == "tiny"
    assert infos["decode"]["max_model_len"] == 1024 and infos["decode"]["num_kv_blocks"] > 0


def test_a_push_to_an_unreachable_decode_worker_answers_502_unreachable(workers):
    r = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"prompt": "hi there", "max_tokens": 4, "decode_url": f"http://127.0.0.1:{free_port()}"})
    error = assert_openai_error(r, 502, "unreachable")
    assert (error["type"], error["code"]) == ("kv_transfer_error", "decode_unreachable")


def test_a_push_that_the_receiver_refuses_answers_502_rejected(workers):
    # A colocated worker has no /v1/kv: it answers 404, which the prefill worker reports as a refusal.
    r = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                      json={"prompt": "hi there", "max_tokens": 4, "decode_url": workers["colocated"].url})
    error = assert_openai_error(r, 502, "refused", "404")
    assert error["code"] == "decode_rejected"
    assert requests.get(f"{workers['prefill'].url}/health", timeout=HTTP_TIMEOUT_S).status_code == 200


def test_a_push_to_a_full_decode_worker_answers_502_full_so_the_gateway_can_answer_429(workers):
    # A real HTTP peer that answers /v1/kv as a full decode worker does: 429 with Retry-After.
    class Full(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"error": {"message": "decode worker is full", "type": "overloaded",
                                         "param": None, "code": "queue_full"}}).encode()
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Full)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                          json={"prompt": "hi there", "max_tokens": 4,
                                "decode_url": f"http://127.0.0.1:{server.server_address[1]}"})
    finally:
        server.shutdown()
    error = assert_openai_error(r, 502, "429")
    assert (error["type"], error["code"]) == ("kv_transfer_error", "decode_full")


def test_a_stop_string_trims_the_text_and_finishes_on_both_paths(workers):
    full = text(generate(workers["colocated"].url, prompt=PROMPTS[1], max_tokens=MAX_TOKENS))
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"pick a prompt whose continuation has visible text mid-way: {full!r}"
    expected = full[:full.index(stop)]

    colocated = generate(workers["colocated"].url, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, stop=[stop])
    assert text(colocated) == expected
    assert colocated[-1]["finish_reason"] == "stop" and colocated[-1]["completion_tokens"] < MAX_TOKENS

    first, events = disaggregated(workers, "stop-1", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, stop=[stop])
    assert first["text"] + text(events) == expected
    assert events[-1]["finish_reason"] == "stop"
    assert metric(workers["decode"].url, "tandem_kv_cache_usage_ratio") == 0
