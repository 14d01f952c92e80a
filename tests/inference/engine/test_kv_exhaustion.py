"""With KV room for only one or two sequences, requests wait (never fail) and all complete correctly."""
import pytest

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import hf_greedy, random_prompts

BLOCK_SIZE = 16
NUM_NEW_TOKENS = 20


def kv_bytes_for_blocks(tiny_model_dir, num_blocks):
    probe = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20, block_size=BLOCK_SIZE))
    return num_blocks * probe.model_runner.pool.num_bytes_per_block


def run(engine, max_steps=2000):
    tokens: dict[str, list[int]] = {}
    max_waiting = max_usage = 0
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return tokens, max_waiting, max_usage
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            assert out.finish_reason in (None, "stop", "length")
        stats = engine.stats()
        max_waiting, max_usage = max(max_waiting, stats["num_waiting"]), max(max_usage, stats["kv_usage"])
    raise AssertionError("the engine did not finish")


def test_colocated_requests_wait_for_blocks_and_all_complete_correctly(tiny_model_dir, hf_model):
    # 4 blocks of 16: one request of ~20 + 20 tokens needs 3 blocks at its longest, so at most one runs at the end
    # and a second one gets preempted (and recomputed) when both grow.
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, block_size=BLOCK_SIZE,
                              kv_cache_bytes=kv_bytes_for_blocks(tiny_model_dir, 4)))
    prompts = random_prompts([18, 20, 12, 25, 6, 22], seed=5)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    tokens, max_waiting, max_usage = run(engine)
    for i, prompt in enumerate(prompts):
        assert tokens[f"r{i}"] == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"r{i}"
    stats = engine.stats()
    assert max_waiting >= 4 and max_usage == 1.0
    assert stats["num_preemptions"] >= 1
    assert stats["num_prefill_tokens_computed"] > sum(map(len, prompts))  # the recomputed tokens count too
    assert stats["num_kv_blocks_used"] == 0


def test_decode_requests_wait_for_their_reservation_and_all_complete_correctly(tiny_model_dir, hf_model):
    num_bytes = kv_bytes_for_blocks(tiny_model_dir, 5)  # one reservation (~40 tokens: 3 blocks) at a time
    prefill = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=4 << 20))
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, block_size=BLOCK_SIZE,
                              kv_cache_bytes=num_bytes))
    prompts = random_prompts([17, 21, 30, 9], seed=6)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    first: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        prefill.add_request(f"r{i}", prompt, params)
    while prefill.has_unfinished():  # chunked prefill: over a few steps
        for out in prefill.step():
            first[out.request_id] = out.new_token_ids
            decode.add_prefilled(out.request_id, prompts[int(out.request_id[1:])], out.new_token_ids[0], params,
                                 *out.kv)
    tokens, max_waiting, _ = run(decode)
    for i, prompt in enumerate(prompts):
        assert first[f"r{i}"] + tokens[f"r{i}"] == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"r{i}"
    stats = decode.stats()
    assert max_waiting >= 2
    assert stats["num_preemptions"] == 0 and stats["num_prefill_tokens_computed"] == 0


def test_a_request_that_could_never_fit_the_pool_is_refused_up_front(tiny_model_dir):
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, block_size=BLOCK_SIZE,
                              kv_cache_bytes=kv_bytes_for_blocks(tiny_model_dir, 2)))
    with pytest.raises(ValueError, match="exceeds max_model_len \\(32, all that its KV pool of 2 blocks holds\\)"):
        engine.add_request("big", list(range(3, 33)), SamplingParams(max_tokens=10))
    assert not engine.has_unfinished()


def test_seeded_sampling_survives_preemption_and_recompute(tiny_model_dir):
    prompts = random_prompts([18, 20, 12, 25], seed=9)
    params = [SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=1.5, top_k=20, seed=100 + i, ignore_eos=True)
              for i in range(len(prompts))]
    roomy = LLMEngine(Config(model=tiny_model_dir, threads=1, block_size=BLOCK_SIZE, kv_cache_bytes=4 << 20))
    tight = LLMEngine(Config(model=tiny_model_dir, threads=1, block_size=BLOCK_SIZE,
                             kv_cache_bytes=kv_bytes_for_blocks(tiny_model_dir, 4)))
    assert tight.generate(prompts, params) == roomy.generate(prompts, params)
    assert tight.stats()["num_preemptions"] >= 1 and roomy.stats()["num_preemptions"] == 0
