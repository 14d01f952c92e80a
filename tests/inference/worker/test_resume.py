"""A request resumed with the tokens it generated before (`resume_token_ids`, what the gateway sends when a worker
died mid-stream) continues where it stopped: the same greedy tokens, the text not yet released and nothing else, the
same finish and usage. Checked at every seam position, on a colocated worker and through prefill → decode."""
from __future__ import annotations

import pytest
import requests

from tests import procs
from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, START_TIMEOUT_S, assert_openai_error, generate, read_stream, start_worker, text, token_ids)

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    workers = {role: start_worker(role, role, tiny_model_dir, log_dir, wait=False)
               for role in ("colocated", "prefill", "decode")}
    try:
        for proc in workers.values():  # started together: their model loads overlap
            procs.wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S)
        yield workers
    finally:
        for proc in workers.values():
            proc.stop()


def _body(**extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, **extra}


def _reference(url: str, **extra) -> tuple[list[int], list[str], dict]:
    """Token ids, the text released with each token event, and the done event of an uninterrupted run."""
    events = generate(url, **_body(**extra))
    tokens = [e for e in events if e["type"] == "token"]
    assert all(len(e["token_ids"]) <= 1 for e in tokens)
    texts_per_token = []
    for e in tokens:
        if e["token_ids"]:
            texts_per_token.append(e["text"])
        else:  # held-back text released at the finish
            texts_per_token[-1] += e["text"]
    return token_ids(events), texts_per_token, events[-1]


@pytest.fixture(scope="module")
def stop_string(workers):
    """A stop string that first appears well into the greedy output, so that text is held back before it."""
    _, texts, _ = _reference(workers["colocated"].url)
    full = "".join(texts)
    for start in range(len(full) // 2, len(full) - 4):
        stop = full[start:start + 4]
        if full.find(stop) == start and stop.strip():
            return stop
    pytest.skip(f"no usable stop string in {full!r}")


@pytest.mark.parametrize("use_stop", [False, True])
def test_a_colocated_worker_continues_at_every_seam(workers, stop_string, use_stop):
    url = workers["colocated"].url
    extra = {"stop": [stop_string]} if use_stop else {}
    ids, texts, done = _reference(url, **extra)
    full = "".join(texts)
    assert done["type"] == "done"
    for k in range(1, len(ids) + 1):
        events = generate(url, **_body(resume_token_ids=ids[:k], **extra))
        assert events[0]["prompt_tokens"] == done["prompt_tokens"]
        assert token_ids(events) == ids[k:], k
        assert "".join(texts[:k]) + text(events) == full, k
        last = events[-1]
        assert (last["type"], last["finish_reason"]) == ("done", done["finish_reason"]), (k, last)
        assert (last["prompt_tokens"], last["completion_tokens"]) == (done["prompt_tokens"],
                                                                      done["completion_tokens"]), k


def test_a_resumed_eos_ends_the_request_at_once(workers, tiny_model_dir):
    from transformers import AutoConfig

    eos = AutoConfig.from_pretrained(tiny_model_dir).eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    ids, _, _ = _reference(workers["colocated"].url)
    events = generate(workers["colocated"].url, **_body(resume_token_ids=[*ids[:3], eos], ignore_eos=False))
    assert token_ids(events) == []
    assert (events[-1]["finish_reason"], events[-1]["completion_tokens"]) == ("stop", 4)


def test_resumed_tokens_that_cannot_belong_to_the_request_answer_400(workers):
    url = workers["colocated"].url
    for resume, fragment in [([1] * (MAX_TOKENS + 1), "more than max_tokens"), ([10**7], "vocabulary"),
                             ("1,2", "list of token ids"), ([-1], "list of token ids")]:
        resp = requests.post(f"{url}/v1/generate", json=_body(resume_token_ids=resume), timeout=HTTP_TIMEOUT_S)
        assert assert_openai_error(resp, 400, fragment)["param"] == "resume_token_ids"


@pytest.mark.parametrize("use_stop", [False, True])
def test_prefill_then_decode_continue_at_seams(workers, stop_string, use_stop):
    extra = {"stop": [stop_string]} if use_stop else {}
    ids, texts, done = _reference(workers["colocated"].url, **extra)
    full = "".join(texts)
    for k in sorted({1, 2, len(ids) // 2, len(ids) - 2, len(ids) - 1, len(ids)}):
        request_id = f"resume-{use_stop}-{k}"
        answer = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S, json=_body(
            request_id=request_id, resume_token_ids=ids[:k], decode_url=workers["decode"].url, **extra))
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["prompt_tokens"] == done["prompt_tokens"]
        if result["finished"]:  # the prefill's token ends it, or (no token) the resumed ones already did
            assert ([] if result["first_token_id"] is None else [result["first_token_id"]]) == ids[k:], k
            assert "".join(texts[:k]) + result["text"] == full and result["finish_reason"] == done["finish_reason"]
            continue
        with requests.get(f"{workers['decode'].url}/v1/stream/{request_id}", stream=True,
                          timeout=HTTP_TIMEOUT_S) as r:
            events = read_stream(r)
        assert [result["first_token_id"], *token_ids(events)] == ids[k:], k
        assert "".join(texts[:k]) + result["text"] + text(events) == full, k
        assert (events[-1]["finish_reason"], events[-1]["prompt_tokens"], events[-1]["completion_tokens"]) == (
            done["finish_reason"], done["prompt_tokens"], done["completion_tokens"]), k


def test_a_resumed_request_keeps_counting_its_penalties(workers):
    # A +60 bias makes the first greedy token repeat; the penalties, counting those repeats, change the text within
    # MAX_TOKENS. A resumed request that forgot its earlier tokens would repeat the token again after the seam.
    url = workers["colocated"].url
    bias = {str(_reference(url)[0][0]): 60}
    extra = {"logit_bias": bias, "presence_penalty": 2.0, "frequency_penalty": 2.0}
    ids, texts, _ = _reference(url, **extra)
    assert ids != _reference(url, logit_bias=bias)[0], "the penalties changed nothing: nothing to check"
    for k in range(1, len(ids)):
        assert token_ids(generate(url, **_body(resume_token_ids=ids[:k], **extra))) == ids[k:], k
    for k in (1, len(ids) // 2, len(ids) - 2):
        request_id = f"resume-penalties-{k}"
        answer = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S, json=_body(
            request_id=request_id, resume_token_ids=ids[:k], decode_url=workers["decode"].url, **extra))
        assert answer.status_code == 200, answer.text
        with requests.get(f"{workers['decode'].url}/v1/stream/{request_id}", stream=True,
                          timeout=HTTP_TIMEOUT_S) as r:
            events = read_stream(r)
        assert [answer.json()["first_token_id"], *token_ids(events)] == ids[k:], k
