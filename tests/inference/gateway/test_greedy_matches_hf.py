"""Concurrent prompts of different lengths, through a disaggregated and a colocated gateway, decode greedily to
exactly what Hugging Face's generate makes of them, token for token."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.inference.gateway.support import PLAIN_FLEET, complete, hf_greedy_texts, shared_workers, sse_events, \
    start_gateway, stop_all

pytestmark = pytest.mark.integration

MAX_TOKENS = 8
PROMPTS = [
    "Hi",
    "The quick brown fox",
    "import os\nimport sys\n\ndef main():",
    "Permission is hereby granted, free of charge, to any person obtaining a copy",
    "class Scheduler:\n    def __init__(self, config):\n        self.config = config\n        self.waiting = []",
    "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED "
    "TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.",
    "for i in range(10):\n    print(i)",
    "This program is free software; you can redistribute it and/or modify it under the terms of the GNU General "
    "Public License as published by the Free Software Foundation; either version 2 of the License, or (at your "
    "option) any later version. This program is distributed in the hope that it will be useful,",
    "x",
]


@pytest.fixture(scope="module")
def gateways(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-greedy")
    disaggregated = start_gateway("gateway-disaggregated", ["--prefill", workers["prefill"].url,
                                                            "--decode", workers["decode"].url], log_dir)
    colocated = start_gateway("gateway-colocated", ["--colocated", workers["colocated"].url], log_dir)
    yield {"disaggregated": disaggregated.url, "colocated": colocated.url}
    stop_all([disaggregated, colocated])


@pytest.fixture(scope="module")
def expected(tiny_model_dir):
    return hf_greedy_texts(tiny_model_dir, PROMPTS, MAX_TOKENS)


def _generate(base_url: str, prompt: str, stream: bool) -> str:
    body = {"model": "tandem", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    resp = complete(base_url, body, timeout=120)
    assert resp.status_code == 200, resp.text
    if not stream:
        return resp.json()["choices"][0]["text"]
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    return "".join(e["choices"][0]["text"] for e in events[:-1])


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_concurrent_greedy_completions_equal_hf_generate(gateways, expected, mode):
    assert len(set(expected)) > 1, "the reference should not be degenerate"
    # Half the prompts stream, half do not, all at once, so they share the workers' batches.
    jobs = [(prompt, i % 2 == 0) for i, prompt in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda job: _generate(gateways[mode], *job), jobs))
    assert texts == expected
