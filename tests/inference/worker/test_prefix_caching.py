"""A real colocated worker reuses a repeated prompt's cached KV blocks (same tokens), says so in /metrics (queried and
hit tokens, hit ratio, cached blocks) and in /info and /health; --no-prefix-caching turns it off."""
from __future__ import annotations

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, generate, metric, start_worker, token_ids

pytestmark = pytest.mark.integration

BLOCK = 16
PROMPT = "The quick brown fox jumps over the lazy dog. " * 8  # ~80+ tokens of the tiny tokenizer


def test_a_repeated_prompt_is_served_from_the_cache_with_the_same_tokens(tiny_model_dir, log_dir):
    worker = start_worker("colocated", "colocated", tiny_model_dir, log_dir, "--block-size", str(BLOCK))
    try:
        first = generate(worker.url, prompt=PROMPT, max_tokens=6, ignore_eos=True)
        second = generate(worker.url, prompt=PROMPT, max_tokens=6, ignore_eos=True)
        assert token_ids(first) == token_ids(second) and len(token_ids(first)) == 6
        num_prompt = second[-1]["prompt_tokens"]
        num_hit = ((num_prompt - 1) // BLOCK) * BLOCK  # every full block but what leaves the last token to compute
        assert metric(worker.url, "tandem_prefix_cache_queried_tokens_total") == 2 * num_prompt
        assert metric(worker.url, "tandem_prefix_cache_hit_tokens_total") == num_hit
        assert metric(worker.url, "tandem_prefix_cache_hit_ratio") == pytest.approx(num_hit / (2 * num_prompt))
        # The prompt's full blocks and those its 6 decoded tokens filled.
        assert metric(worker.url, "tandem_prefix_cache_blocks") == (num_prompt + 5) // BLOCK
        assert metric(worker.url, "tandem_prefill_tokens_computed_total") == 2 * num_prompt - num_hit
        info = requests.get(worker.url + "/info", timeout=HTTP_TIMEOUT_S).json()
        assert info["prefix_caching"] is True
        assert info["prefix_cache"] == {"queried_tokens": 2 * num_prompt, "hit_tokens": num_hit,
                                        "blocks": (num_prompt + 5) // BLOCK}
        assert requests.get(worker.url + "/health", timeout=HTTP_TIMEOUT_S).json()["prefix_caching"] is True
    finally:
        worker.stop()


def test_no_prefix_caching_computes_every_prompt_token(tiny_model_dir, log_dir):
    worker = start_worker("colocated", "colocated", tiny_model_dir, log_dir, "--no-prefix-caching")
    try:
        first = generate(worker.url, prompt=PROMPT, max_tokens=3, ignore_eos=True)
        second = generate(worker.url, prompt=PROMPT, max_tokens=3, ignore_eos=True)
        assert token_ids(first) == token_ids(second)
        assert metric(worker.url, "tandem_prefix_cache_hit_tokens_total") == 0
        assert metric(worker.url, "tandem_prefill_tokens_computed_total") == 2 * second[-1]["prompt_tokens"]
        assert requests.get(worker.url + "/info", timeout=HTTP_TIMEOUT_S).json()["prefix_caching"] is False
        assert requests.get(worker.url + "/health", timeout=HTTP_TIMEOUT_S).json()["prefix_caching"] is False
    finally:
        worker.stop()
