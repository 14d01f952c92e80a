"""A real colocated worker prefills a long prompt in chunks unless --no-chunked-prefill, and says so in
tandem_batch_tokens_per_step (tokens per engine step, prefill and decode together)."""
from __future__ import annotations

import pytest

from tests.inference.worker.support import generate, metric, start_worker, token_ids

pytestmark = pytest.mark.integration

CHUNK = 16
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # ~100+ tokens of the tiny tokenizer


# A prompt alone (no stream decoding beside it) is fed --prefill-chunk-size-alone tokens a step: set to the chunk.
CHUNK_FLAGS = ["--prefill-chunk-size", str(CHUNK), "--prefill-chunk-size-alone", str(CHUNK)]


@pytest.mark.parametrize("flags, chunked", [(CHUNK_FLAGS, True), ([*CHUNK_FLAGS, "--no-chunked-prefill"], False)])
def test_a_long_prompts_steps_stay_within_the_chunk_size_only_when_chunking_is_on(tiny_model_dir, log_dir, flags,
                                                                                    chunked):
    worker = start_worker("colocated", "colocated", tiny_model_dir, log_dir, *flags)
    try:
        events = generate(worker.url, prompt=LONG_PROMPT, max_tokens=3, ignore_eos=True)
        assert len(token_ids(events)) == 3
        num_prompt_tokens = events[-1]["prompt_tokens"]
        assert num_prompt_tokens > 4 * CHUNK
        num_steps = metric(worker.url, "tandem_batch_tokens_per_step_count", role="colocated")
        num_small_steps = metric(worker.url, "tandem_batch_tokens_per_step_bucket", le=f"{CHUNK}.0")
        assert metric(worker.url, "tandem_batch_tokens_per_step_sum") == num_prompt_tokens + 2  # + 2 decodes
    finally:
        worker.stop()
    if chunked:
        assert num_steps == -(-num_prompt_tokens // CHUNK) + 2 and num_small_steps == num_steps
    else:
        assert num_steps == 3 and num_small_steps == 2  # the whole prompt in one step, then 2 decodes
