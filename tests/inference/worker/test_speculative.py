"""Workers started with --speculative: several tokens per step reach the client exactly as single tokens do (token
ids, text, stop strings cut inside an accepted run, completion counts), on a colocated worker and on a decode worker
fed by a prefill worker; /info shows the setting and /metrics the proposed and accepted drafts; bad values stop the
worker naming the flag. Tiny model, float32 on every worker, layer drafts (3 of its 4 layers) so that runs of
several tokens are accepted (min_acceptance 0 keeps them drafting)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, generate, metric, read_stream, start_worker, text, \
    token_ids
from tests.procs import ROOT, wait_http

pytestmark = pytest.mark.integration

SPEC = {"method": "layers", "num_tokens": 4, "layers": 3, "min_acceptance": 0}
PROMPTS = ["Hello world, this is", "def fibonacci(n):\n    ", "The license grants you the right to"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    common = ("--block-size", "4", "--dtype", "float32")
    spec = ("--speculative", json.dumps(SPEC))
    started = {}
    try:
        started["plain"] = start_worker("plain", "colocated", tiny_model_dir, log_dir, *common, wait=False)
        started["spec"] = start_worker("spec", "colocated", tiny_model_dir, log_dir, *common, *spec, wait=False)
        started["prefill"] = start_worker("prefill", "prefill", tiny_model_dir, log_dir, *common, wait=False)
        started["decode"] = start_worker("decode", "decode", tiny_model_dir, log_dir, *common, *spec, wait=False)
        for proc in started.values():
            wait_http(proc, proc.url + "/health", timeout=600)  # four models loading at once on a loaded host
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _done(events):
    assert events[-1]["type"] == "done", events[-1]
    return events[-1]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_tokens_text_and_counts_equal_the_plain_workers(workers, prompt):
    plain = generate(workers["plain"].url, prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
    spec = generate(workers["spec"].url, prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert token_ids(spec) == token_ids(plain) and len(token_ids(plain)) == MAX_TOKENS
    assert text(spec) == text(plain)
    assert _done(spec)["completion_tokens"] == _done(plain)["completion_tokens"] == MAX_TOKENS
    assert _done(spec)["finish_reason"] == "length"
    # Several tokens arrived in one event: the accepted runs reached the client as such.
    assert max(len(e["token_ids"]) for e in spec if e["type"] == "token") > 1


def test_a_stop_string_inside_an_accepted_run_ends_the_text_where_the_plain_worker_does(workers):
    url = workers["spec"].url
    prompt = PROMPTS[0]
    events = generate(url, prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
    # The text of a token in the middle of a multi-token event is the stop string (its first occurrence there).
    full = text(events)
    stop = None
    seen = ""
    for event in events:
        if event["type"] == "token" and len(event["token_ids"]) >= 3 and len(event["text"]) >= 4:
            candidate = event["text"][1:4]
            if candidate.strip() and full.find(candidate) >= len(seen):
                stop = candidate
                break
        if event["type"] == "token":
            seen += event["text"]
    assert stop is not None, "no accepted run with text to stop in"
    results = []
    for name in ("plain", "spec"):
        got = generate(workers[name].url, prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop])
        results.append((text(got), _done(got)["finish_reason"], _done(got)["completion_tokens"], token_ids(got)))
    assert results[0] == results[1]
    assert results[1][1] == "stop" and stop not in results[1][0] and results[1][2] < MAX_TOKENS


def test_a_decode_worker_speculates_on_what_the_prefill_worker_handed_over(workers):
    for index, prompt in enumerate(PROMPTS):
        request_id = f"spec-{index}"
        r = requests.post(f"{workers['prefill'].url}/v1/prefill", timeout=HTTP_TIMEOUT_S,
                          json={"request_id": request_id, "decode_url": workers["decode"].url, "prompt": prompt,
                                "max_tokens": MAX_TOKENS, "ignore_eos": True})
        assert r.status_code == 200, r.text
        first = r.json()
        with requests.get(f"{workers['decode'].url}/v1/stream/{request_id}", stream=True,
                          timeout=HTTP_TIMEOUT_S) as s:
            events = read_stream(s)
        plain = generate(workers["plain"].url, prompt=prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert [first["first_token_id"], *token_ids(events)] == token_ids(plain)
        assert first["text"] + text(events) == text(plain)
        assert _done(events)["completion_tokens"] == MAX_TOKENS
    assert metric(workers["decode"].url, "tandem_spec_decode_proposed_tokens_total", role="decode") > 0


def test_info_shows_the_setting_and_metrics_count_the_drafts(workers):
    info = requests.get(workers["spec"].url + "/info", timeout=HTTP_TIMEOUT_S).json()
    assert info["speculative"] == SPEC
    assert requests.get(workers["plain"].url + "/info", timeout=HTTP_TIMEOUT_S).json()["speculative"] is None
    generate(workers["spec"].url, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, ignore_eos=True)
    url = workers["spec"].url
    proposed = metric(url, "tandem_spec_decode_proposed_tokens_total", role="colocated")
    accepted = metric(url, "tandem_spec_decode_accepted_tokens_total", role="colocated")
    assert 0 < accepted < proposed
    assert metric(url, "tandem_spec_decode_acceptance_ratio") == pytest.approx(accepted / proposed)
    assert metric(workers["plain"].url, "tandem_spec_decode_proposed_tokens_total") == 0


@pytest.mark.parametrize("role, value, fragment", [
    ("colocated", "{not json", "--speculative: not JSON"),
    ("colocated", '{"method": "ngram", "num_tokens": 0}', "--speculative num_tokens must be an integer in 1..16"),
    ("prefill", '{"method": "ngram", "num_tokens": 2}', "--speculative is for the decode and colocated roles"),
])
def test_a_bad_value_exits_2_naming_the_flag(tiny_model_dir, role, value, fragment):
    result = subprocess.run([sys.executable, "-m", "inference.worker", "--role", role, "--model",
                             str(tiny_model_dir), "--port", "1", "--speculative", value], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert fragment in result.stderr, result.stderr
