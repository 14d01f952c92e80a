"""Prefix caching never changes outputs: requests that share prefixes (across block edges, with chunked prefill on
and off, a chat's next turn, a preempted sequence) give exactly Hugging Face's greedy tokens, float32 on both sides,
while the engine computes only the uncached tokens."""
import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.roles import Role
from tests.inference.engine.support import hf_greedy, random_prompts

BLOCK_SIZE = 16
NUM_NEW_TOKENS = 10


def engine_of(model_dir, **settings):
    settings = {"threads": 1, "kv_cache_bytes": 8 << 20, "block_size": BLOCK_SIZE, "dtype": "float32", **settings}
    return LLMEngine(Config(model=model_dir, **settings))


def one_by_one(engine, prompts, max_tokens=NUM_NEW_TOKENS):
    """Each prompt to completion before the next, so that each finds what the earlier ones left cached."""
    return [engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
            for prompt in prompts]


def prompts_sharing(head_len, tail_lens, seed):
    (head,) = random_prompts([head_len], seed=seed)
    tails = random_prompts(tail_lens, seed=seed + 1)
    return [head + tail for tail in tails]


@pytest.mark.parametrize("chunked_prefill", [True, False])
@pytest.mark.parametrize("head_len", [BLOCK_SIZE - 1, 2 * BLOCK_SIZE, 2 * BLOCK_SIZE + 1, 5 * BLOCK_SIZE - 1])
def test_requests_sharing_a_prefix_match_hugging_face_and_skip_the_cached_blocks(tiny_model_dir, hf_model,
                                                                                 chunked_prefill, head_len):
    engine = engine_of(tiny_model_dir, chunked_prefill=chunked_prefill, prefill_chunk_size=24)
    prompts = prompts_sharing(head_len, [1, 7, BLOCK_SIZE, 40], seed=head_len)
    outputs = one_by_one(engine, prompts)
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    stats = engine.stats()
    # The first prompt finds nothing; each later one finds the head's full blocks (and no more: tails differ).
    expected_hits = 3 * (head_len // BLOCK_SIZE) * BLOCK_SIZE
    assert stats["prefix_cache_hit_tokens"] == expected_hits
    assert stats["prefix_cache_queried_tokens"] == sum(map(len, prompts))
    assert stats["num_prefill_tokens_computed"] == sum(map(len, prompts)) - expected_hits


@pytest.mark.parametrize("length", [BLOCK_SIZE, 3 * BLOCK_SIZE, 3 * BLOCK_SIZE + 5])
def test_the_same_prompt_again_computes_only_its_last_block_or_less(tiny_model_dir, hf_model, length):
    engine = engine_of(tiny_model_dir)
    (prompt,) = random_prompts([length], seed=length)
    first, second = one_by_one(engine, [prompt, prompt])
    assert first == second == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS)
    # At least the last token is computed, so that the step samples: a prompt of whole blocks recomputes its last.
    num_hit = ((length - 1) // BLOCK_SIZE) * BLOCK_SIZE
    assert engine.stats()["prefix_cache_hit_tokens"] == num_hit
    assert engine.stats()["num_prefill_tokens_computed"] == 2 * length - num_hit


@pytest.mark.parametrize("chunked_prefill", [True, False])
def test_a_chats_next_turn_finds_its_history_including_the_decoded_tokens(tiny_model_dir, hf_model,
                                                                          chunked_prefill):
    engine = engine_of(tiny_model_dir, chunked_prefill=chunked_prefill)
    (turn1,) = random_prompts([37], seed=3)
    (reply1,) = one_by_one(engine, [turn1], max_tokens=30)
    (user2,) = random_prompts([9], seed=4)
    turn2 = turn1 + reply1 + user2  # 76 tokens: blocks 0-3 hold prompt and reply, both cached
    before = engine.stats()["prefix_cache_hit_tokens"]
    (reply2,) = one_by_one(engine, [turn2])
    assert reply2 == hf_greedy(hf_model, turn2, NUM_NEW_TOKENS)
    # The reply's K/V: decoding filled blocks 2 and 3 (tokens 32..63), and they were keyed as they filled.
    assert engine.stats()["prefix_cache_hit_tokens"] - before == 4 * BLOCK_SIZE


def test_concurrent_requests_share_blocks_and_match_hugging_face(tiny_model_dir, hf_model):
    engine = engine_of(tiny_model_dir, prefill_chunk_size=BLOCK_SIZE)
    prompts = prompts_sharing(3 * BLOCK_SIZE, [5, 20, 33, 2], seed=11)
    engine.generate(prompts[:1], SamplingParams(max_tokens=1))  # warm the head
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf_model, prompt, NUM_NEW_TOKENS)
    assert engine.block_manager.num_used_blocks == 0  # every reference released


@pytest.mark.parametrize("chunked_prefill", [True, False])
def test_a_preempted_sequence_restarts_from_its_cached_blocks_with_the_same_tokens(tiny_model_dir, hf_model,
                                                                                   chunked_prefill):
    # 11 blocks: A (47 tokens, 3 blocks) and B (120 tokens, 8 blocks) fill the pool; A's 49th token needs a 4th
    # block, so B (the newest) is preempted; its full computed blocks stay cached while A takes its partial one, and
    # B starts again from them once A is done.
    bytes_per_block = engine_of(tiny_model_dir, kv_cache_bytes=1 << 20).model_runner.pool.num_bytes_per_block
    engine = engine_of(tiny_model_dir, kv_cache_bytes=11 * bytes_per_block, chunked_prefill=chunked_prefill,
                       prefill_chunk_size=64, prefill_chunk_size_alone=64)  # chunked: 64 tokens in every step
    prompts = random_prompts([47, 120], seed=21)
    params = [SamplingParams(max_tokens=4, ignore_eos=True), SamplingParams(max_tokens=8, ignore_eos=True)]
    outputs = engine.generate(prompts, params)
    assert engine.stats()["num_preemptions"] >= 1
    for prompt, output, p in zip(prompts, outputs, params):
        assert output == hf_greedy(hf_model, prompt, p.max_tokens)
    # B found its computed full blocks again (chunked: the 3 of its first 63-token chunk; whole: 7 of 8).
    assert engine.stats()["prefix_cache_hit_tokens"] == (3 if chunked_prefill else 7) * BLOCK_SIZE


def test_without_prefix_caching_nothing_is_cached(tiny_model_dir):
    engine = engine_of(tiny_model_dir, prefix_caching=False)
    (prompt,) = random_prompts([50], seed=5)
    one_by_one(engine, [prompt, prompt])
    stats = engine.stats()
    assert (stats["prefix_cache_hit_tokens"], stats["prefix_cache_blocks"]) == (0, 0)
    assert stats["num_prefill_tokens_computed"] == 100


def test_a_prefill_worker_exports_the_whole_prompts_kv_from_shared_blocks(tiny_model_dir):
    warm = engine_of(tiny_model_dir, role=Role.PREFILL)
    cold = engine_of(tiny_model_dir, role=Role.PREFILL, prefix_caching=False)
    first, second = prompts_sharing(2 * BLOCK_SIZE + 3, [4, 9], seed=31)

    def prefill(engine, request_id, prompt):
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=5))
        while True:
            for out in engine.step():
                return out

    prefill(warm, "a", first)
    out_warm, out_cold = prefill(warm, "b", second), prefill(cold, "b", second)
    assert warm.stats()["prefix_cache_hit_tokens"] == 2 * BLOCK_SIZE
    assert out_warm.new_token_ids == out_cold.new_token_ids
    for warm_kv, cold_kv in zip(out_warm.kv, out_cold.kv):  # [L, P, Hkv, D] float32 each
        shape = warm.model_runner.shape
        assert warm_kv.shape == cold_kv.shape == (shape.num_layers, len(second), shape.num_kv_heads, shape.head_dim)
        # Same tolerance as chunked prefill's: the warm engine attends its 9 new tokens over cached K/V, the cold
        # one over all 44 in one pass, so float32 sums run in another order (CI saw 1.4e-5 at layer 2).
        torch.testing.assert_close(warm_kv, cold_kv, rtol=1e-4, atol=1e-4)


def test_a_decode_engine_runs_without_a_prefix_cache(tiny_model_dir):
    engine = engine_of(tiny_model_dir, role=Role.DECODE)
    assert engine.prefix_caching is False and engine.block_manager.prefix_cache is None
