"""A real colocated worker keys each tenant's prefix-cache blocks with the request's cache_salt (the gateway sends
the tenant): the same prompt from two tenants computes every token twice, the same tenant hits its blocks, and the
deployment's shared prompt (--shared-prompt), as a prompt's start or a chat's system message, is reused across
tenants. Measured by the hit tokens the worker reports on /info."""
from __future__ import annotations

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, assert_openai_error, generate, start_worker

pytestmark = pytest.mark.integration

BLOCK = 16
SYSTEM = "You are a careful assistant. Answer briefly, truthfully and in plain words. " * 3
PRIVATE = "My account number is 4417 and my doctor said the results were " * 3


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    proc = start_worker("colocated", "colocated", tiny_model_dir, tmp_path_factory.mktemp("tenant-cache"),
                        "--block-size", str(BLOCK), "--shared-prompt", SYSTEM)
    yield proc
    proc.stop()


def _hits(worker, **body) -> tuple[int, int]:
    """(prompt tokens, prompt tokens found cached) of one request."""
    before = requests.get(worker.url + "/info", timeout=HTTP_TIMEOUT_S).json()["prefix_cache"]["hit_tokens"]
    events = generate(worker.url, max_tokens=2, ignore_eos=True, **body)
    after = requests.get(worker.url + "/info", timeout=HTTP_TIMEOUT_S).json()["prefix_cache"]["hit_tokens"]
    return events[-1]["prompt_tokens"], after - before


def test_the_same_prompt_from_another_tenant_finds_nothing_cached(worker):
    num_prompt, _ = _hits(worker, prompt=PRIVATE, cache_salt="tenant-a")
    assert num_prompt > 2 * BLOCK
    assert _hits(worker, prompt=PRIVATE, cache_salt="tenant-b") == (num_prompt, 0)
    assert _hits(worker, prompt=PRIVATE) == (num_prompt, 0)  # nor does a request without a tenant


def test_the_same_tenant_hits_its_own_blocks(worker):
    num_prompt, _ = _hits(worker, prompt="Again: " + PRIVATE, cache_salt="tenant-c")
    assert _hits(worker, prompt="Again: " + PRIVATE, cache_salt="tenant-c") == (
        num_prompt, (num_prompt - 1) // BLOCK * BLOCK)


def test_the_shared_prompt_is_reused_across_tenants_but_not_what_follows_it(worker):
    prompt = SYSTEM + "Tell tenant d about " + PRIVATE
    _hits(worker, prompt=prompt, cache_salt="tenant-d")
    num_prompt, num_hit = _hits(worker, prompt=prompt, cache_salt="tenant-e")
    num_system = generate(worker.url, prompt=SYSTEM, max_tokens=1)[-1]["prompt_tokens"]
    assert num_hit == num_system // BLOCK * BLOCK >= 2 * BLOCK  # the shared prompt's full blocks
    assert num_hit < num_prompt - BLOCK  # and none of tenant d's own


def test_a_chat_with_the_shared_system_prompt_reuses_it_across_tenants(worker):
    def chat(user: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    _hits(worker, messages=chat("What is the capital of France?"), cache_salt="tenant-f")
    _, num_hit = _hits(worker, messages=chat("How do I boil an egg?"), cache_salt="tenant-g")
    assert num_hit >= 2 * BLOCK


def test_a_bad_cache_salt_is_a_400_naming_it(worker):
    for salt in (7, "", "x" * 257):
        r = requests.post(worker.url + "/v1/generate", json={"prompt": "hi", "cache_salt": salt},
                          timeout=HTTP_TIMEOUT_S)
        assert assert_openai_error(r, 400, "cache_salt")["param"] == "cache_salt"
