"""Sampling defaults fill what a request leaves out (its own values always win): from --default-* flags on a
static gateway, from the deployment's `sampling_defaults` in the control plane's endpoints answer otherwise, picked
up at the next poll. /v1/models shows them. Real gateway, real workers."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, complete, shared_workers, start_gateway
from tests.inference.gateway.test_control_plane import TOKEN, ControlPlane

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def workers(request, tiny_model_dir, tmp_path_factory):
    return shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)


@pytest.fixture(scope="module")
def static_gateway(workers, tmp_path_factory):
    gateway = start_gateway("gateway", ["--prefill", workers["prefill"].url, "--decode", workers["decode"].url,
                                        "--served-model-name", "demo", "--default-temperature", "0",
                                        "--default-max-tokens", "6"], tmp_path_factory.mktemp("gateway-defaults"))
    yield gateway
    gateway.stop()


def _completion(gateway, **fields) -> dict:
    resp = complete(gateway.url, {"model": "demo", "prompt": PROMPT, "ignore_eos": True, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_request_that_leaves_them_out_gets_the_defaults(static_gateway):
    plain = _completion(static_gateway)
    assert plain["usage"]["completion_tokens"] == 6  # not OpenAI's 16
    greedy = _completion(static_gateway, temperature=0, max_tokens=6)
    # Greedy by default: the same text as an explicitly greedy request, every time.
    assert plain["choices"][0]["text"] == greedy["choices"][0]["text"] == _completion(static_gateway)["choices"][0][
        "text"]


def test_a_requests_own_values_win(static_gateway):
    assert _completion(static_gateway, max_tokens=3)["usage"]["completion_tokens"] == 3
    greedy = _completion(static_gateway, max_tokens=12)["choices"][0]["text"]
    # A seeded draw at temperature 2 of the tiny random-weight model: not the greedy text.
    sampled = _completion(static_gateway, max_tokens=12, temperature=2, seed=7)["choices"][0]["text"]
    assert sampled != greedy
    refused = complete(static_gateway.url, {"model": "demo", "prompt": PROMPT, "temperature": 2.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "temperature"


def test_chat_takes_the_default_max_tokens_too(static_gateway):
    resp = requests.post(static_gateway.url + "/v1/chat/completions", json={
        "model": "demo", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 6


def test_models_shows_them(static_gateway):
    (model,) = requests.get(static_gateway.url + "/v1/models", timeout=10).json()["data"]
    assert model["sampling_defaults"] == {"temperature": 0.0, "max_tokens": 6}


def test_a_bad_default_flag_is_a_usage_error_naming_it_and_the_control_plane_owns_them():
    result = subprocess.run([sys.executable, "-m", "inference.gateway", "--port", "0", "--colocated",
                             "http://127.0.0.1:1", "--default-top-p", "1.5"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--default-top-p: must be a number in (0, 1]" in result.stderr
    both = subprocess.run([sys.executable, "-m", "inference.gateway", "--port", "0", "--control-plane",
                           "http://127.0.0.1:1", "--deployment", "demo", "--token", "t", "--default-temperature", "0"],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "with --control-plane the deployment's sampling_defaults apply" in both.stderr


def test_the_control_planes_defaults_apply_from_the_next_poll(workers, tmp_path_factory):
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints["groups"] = [{"revision": 1, "prefill": [], "decode": [],
                                          "colocated": [workers["colocated"].url]}]
    control_plane.endpoints["sampling_defaults"] = {"temperature": 0.0, "max_tokens": 4}
    gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                        "--token", TOKEN, "--membership-interval", "0.2"],
                            tmp_path_factory.mktemp("gateway-cp-defaults"))
    try:
        assert _completion(gateway)["usage"]["completion_tokens"] == 4
        control_plane.endpoints["sampling_defaults"] = {"temperature": 0.0, "max_tokens": 7}
        control_plane.wait_polls(2)
        deadline = time.monotonic() + 15
        while _completion(gateway)["usage"]["completion_tokens"] != 7:
            assert time.monotonic() < deadline, "the new default max_tokens never applied"
            time.sleep(0.1)
        (model,) = requests.get(gateway.url + "/v1/models", timeout=10).json()["data"]
        assert model["sampling_defaults"] == {"temperature": 0.0, "max_tokens": 7}
        # A malformed answer keeps the last good defaults (and membership).
        control_plane.endpoints["sampling_defaults"] = {"max_tokens": 0}
        control_plane.wait_polls(2)
        assert _completion(gateway)["usage"]["completion_tokens"] == 7
    finally:
        gateway.stop()
        control_plane.stop()
