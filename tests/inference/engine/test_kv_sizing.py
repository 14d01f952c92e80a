"""kv_cache_bytes "auto" sizes the KV pool from the memory free after the weights load; a pool smaller than the
model's context shrinks the context the engine serves to what it holds."""
from __future__ import annotations

import psutil
import pytest

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.config import ConfigError
from inference.engine.kv_sizing import MAX_FRACTION_FOR_ONE_CONTEXT, choose_num_blocks
from tests.inference.engine.support import hf_greedy, random_prompts

TINY_CONTEXT = 1024  # the tiny model's max_position_embeddings
BLOCK = 1000  # bytes per block in the arithmetic tests


def choose(num_free_bytes, fraction=0.5, max_model_len=160, max_num_seqs=4):
    return choose_num_blocks(num_free_bytes=num_free_bytes, fraction=fraction, num_bytes_per_block=BLOCK,
                             block_size=16, max_model_len=max_model_len, max_num_seqs=max_num_seqs)


def test_the_pool_is_the_fraction_of_free_memory_between_the_clamps():
    choice = choose(60 * BLOCK)  # one context is 10 blocks, four are 40: half of 60 blocks lies between
    assert (choice.num_blocks, choice.reason) == (30, "fraction")


def test_the_pool_holds_one_full_context_when_memory_allows():
    assert (choose(12 * BLOCK).num_blocks, choose(12 * BLOCK).reason) == (10, "one full context")


def test_the_pool_holds_no_more_than_max_num_seqs_full_contexts():
    assert (choose(10_000 * BLOCK).num_blocks, choose(10_000 * BLOCK).reason) == (40, "max_num_seqs full contexts")


def test_where_one_context_does_not_fit_the_pool_is_what_the_fraction_allows():
    num_free_bytes = int(10 * BLOCK / MAX_FRACTION_FOR_ONE_CONTEXT) - BLOCK
    assert choose(num_free_bytes).num_blocks == int(num_free_bytes * 0.5) // BLOCK < 10


def test_auto_sizes_the_pool_from_available_memory_and_one_full_context_fits(tiny_model_dir):
    available_before = psutil.virtual_memory().available
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1))
    assert engine.config.kv_cache_bytes == "auto"
    runner = engine.model_runner
    num_blocks_per_context = TINY_CONTEXT // runner.pool.block_size
    assert num_blocks_per_context <= runner.num_blocks <= num_blocks_per_context * engine.config.max_num_seqs
    num_bytes_per_block = runner.pool.num_bytes_per_block
    assert runner.num_blocks * num_bytes_per_block <= max(0.2 * available_before,
                                                          num_blocks_per_context * num_bytes_per_block)
    assert engine.max_model_len == engine.configured_max_model_len == TINY_CONTEXT


def test_a_small_fraction_still_holds_one_full_context(tiny_model_dir):
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_memory_fraction=1e-9, max_num_seqs=2))
    assert engine.block_manager.num_blocks == TINY_CONTEXT // 16
    assert engine.max_model_len == TINY_CONTEXT


def test_a_pool_smaller_than_the_context_serves_the_context_it_holds(tiny_model_dir, hf_model):
    probe = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20))
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1,
                              kv_cache_bytes=4 * probe.model_runner.pool.num_bytes_per_block))
    assert (engine.max_model_len, engine.configured_max_model_len) == (64, TINY_CONTEXT)
    (prompt,) = random_prompts([20], seed=3)
    params = SamplingParams(max_tokens=44, ignore_eos=True)  # exactly the pool: 20 + 44 = 64 tokens
    assert engine.generate([prompt], params) == [hf_greedy(hf_model, prompt, 44)]
    with pytest.raises(ValueError, match=r"= 65 exceeds max_model_len \(64, all that its KV pool of 4 blocks holds"):
        engine.add_request("over", prompt, SamplingParams(max_tokens=45))


def test_a_budget_handed_by_the_placer_sizes_the_pool_instead_of_free_memory(tiny_model_dir):
    probe = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20)).model_runner
    num_blocks_per_context = TINY_CONTEXT // probe.pool.block_size
    budget = 3 * num_blocks_per_context * probe.pool.num_bytes_per_block + probe.pool.num_bytes_per_block // 2
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_memory_budget=budget, max_num_seqs=8))
    assert engine.block_manager.num_blocks == 3 * num_blocks_per_context  # the whole budget: fraction 1


def test_a_cpu_pool_takes_ram_only_for_the_blocks_in_use(tiny_model_dir):
    """The pool lies in an anonymous memory map: a 1 GiB pool adds no RSS at start, and a request adds its blocks."""
    process = psutil.Process()
    LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20))  # weights and torch's own buffers
    rss_before = process.memory_info().rss
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 30))
    pool_bytes = 2 * engine.model_runner.k_cache.numel() * engine.model_runner.k_cache.element_size()
    assert pool_bytes >= 1 << 29
    grown = process.memory_info().rss - rss_before
    assert grown < pool_bytes / 8, f"RSS grew by {grown >> 20} MiB for a pool of {pool_bytes >> 20} MiB"
    assert float(engine.model_runner.k_cache[:, :4].abs().sum()) == 0.0  # zeroed, as attention needs
    (prompt,) = random_prompts([40], seed=2)
    assert len(engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]) == 8
    assert process.memory_info().rss - rss_before < pool_bytes / 8


@pytest.mark.parametrize("settings, field", [
    ({"kv_cache_bytes": "64M"}, "kv_cache_bytes"), ({"kv_cache_bytes": 0}, "kv_cache_bytes"),
    ({"kv_memory_fraction": 0}, "kv_memory_fraction"), ({"kv_memory_fraction": 1.5}, "kv_memory_fraction"),
    ({"kv_memory_fraction": True}, "kv_memory_fraction"), ({"kv_memory_budget": 0}, "kv_memory_budget"),
    ({"kv_memory_budget": "1G"}, "kv_memory_budget"),
])
def test_bad_kv_settings_are_refused(tiny_model_dir, settings, field):
    with pytest.raises(ConfigError) as exc:
        Config(model=tiny_model_dir, **settings)
    assert exc.value.field == field
