"""`compile`: the decode step compiled (inductor on this CPU) gives exactly the eager engine's greedy tokens; without
a C++ compiler the engine runs eager and says why."""
from __future__ import annotations

import logging

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine import model_runner
from inference.engine.compilation import padded_batch_size, pads_decode_batch
from inference.engine.config import ConfigError
from tests.inference.engine.support import hf_greedy, random_prompts

# Contexts across block edges (16) so that decode steps see 1 to 7 blocks, and a batch that shrinks as prompts end.
PROMPT_LENGTHS = [5, 16, 40, 90]


def _engine(model_dir, **settings) -> LLMEngine:
    return LLMEngine(Config(model=model_dir, threads=1, dtype="float32", kv_cache_bytes=8 << 20, **settings))


def test_compiled_decode_steps_give_the_eager_engines_greedy_tokens(tiny_model_dir):
    compiled = _engine(tiny_model_dir, compile=True)
    info = compiled.compile_info
    assert info["enabled"] is True and info["fallback"] is None, info
    assert info["backend"] == "inductor" and info["warmup_s"] > 0
    # The warm-up's dummy steps wrote into block 0; nothing of them may be left for a real request to read.
    assert not compiled.model_runner.k_cache[:, 0].any() and not compiled.model_runner.v_cache[:, 0].any()

    calls = []
    forward = compiled.model_runner._compiled_decode_forward
    compiled.model_runner._compiled_decode_forward = lambda *args: calls.append(1) or forward(*args)
    prompts = random_prompts(PROMPT_LENGTHS, seed=5)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (24, 8, 30, 12)]
    eager_outputs = _engine(tiny_model_dir).generate(prompts, params)
    assert compiled.generate(prompts, params) == eager_outputs
    assert len(calls) >= 20, "the decode-only steps ran through the compiled forward"  # 29, less mixed steps


def test_without_a_cpp_compiler_the_engine_runs_eager_with_one_log_line(tiny_model_dir, hf_model, caplog):
    # What inductor finds on a host without one: its own compiler search fails. Through the config's own patch:
    # monkeypatch's undo left `cpp.cxx` unreadable to the next compile in the process (torch 2.13's config module).
    with torch._inductor.config.patch({"cpp.cxx": (None, "/nonexistent/bin/g++")}), \
            caplog.at_level(logging.INFO, logger="inference.engine.compilation"):
        engine = _engine(tiny_model_dir, compile=True)
    info = engine.compile_info
    assert info["enabled"] is False and "C++ compiler" in info["fallback"], info
    records = [r for r in caplog.records if r.name == "inference.engine.compilation"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING and "C++ compiler" in records[0].message
    prompt = random_prompts([20], seed=6)[0]
    assert engine.generate([prompt], SamplingParams(max_tokens=6))[0] == hf_greedy(hf_model, prompt, 6)


def test_a_prefill_engine_compiles_nothing_and_says_why(tiny_model_dir):
    engine = _engine(tiny_model_dir, compile=True, role="prefill")
    assert engine.compile_info["enabled"] is False and "prefill" in engine.compile_info["fallback"]
    assert engine.compile_info["warmup_s"] == 0.0


def test_compile_is_off_by_default_and_must_be_a_boolean(tiny_model_dir):
    assert Config(model=tiny_model_dir).compile is False
    with pytest.raises(ConfigError, match="compile must be true or false"):
        Config(model=tiny_model_dir, compile="yes")


def test_batch_buckets_on_cuda_only_and_not_for_a_prefill_engine(tiny_model_dir):
    assert [padded_batch_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 64)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 24, 24, 32, 64]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pads_decode_batch(Config(model=tiny_model_dir, compile=True), cuda)
    assert not pads_decode_batch(Config(model=tiny_model_dir, compile=True), cpu)
    assert not pads_decode_batch(Config(model=tiny_model_dir), cuda)
    assert not pads_decode_batch(Config(model=tiny_model_dir, compile=True, role="prefill"), cuda)


def test_a_padded_batch_gives_the_unpadded_engines_tokens_and_writes_only_the_scratch_block(tiny_model_dir,
                                                                                             monkeypatch):
    # What a compiled step does on CUDA (one CUDA graph per bucket), here through inductor on this CPU: the batch is
    # padded to its bucket, the padding rows' K/V go into a block the block manager never hands out.
    monkeypatch.setattr(model_runner, "pads_decode_batch", lambda config, device: bool(config.compile))
    padded = _engine(tiny_model_dir, compile=True)
    runner = padded.model_runner
    assert padded.compile_info["pads_batch"] is True
    assert runner.scratch_block == runner.num_blocks == padded.block_manager.num_blocks
    assert runner.k_cache.shape[1] == runner.num_blocks + 1

    rows = []
    forward = runner._compiled_decode_forward
    runner._compiled_decode_forward = lambda ids, *args: rows.append(ids.shape[0]) or forward(ids, *args)
    prompts = random_prompts([5, 16, 40, 90, 7], seed=8)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (24, 8, 30, 12, 3)]
    unpadded = _engine(tiny_model_dir)
    assert padded.generate(prompts, params) == unpadded.generate(prompts, params)
    assert set(rows) <= {1, 2, 4, 8} and 8 in rows and 4 in rows, rows  # 5 and 3 running sequences padded up
    # Every block the sequences had holds what the unpadded engine's holds: no padding row wrote into one.
    for padded_pool, pool in ((runner.k_cache, unpadded.model_runner.k_cache),
                              (runner.v_cache, unpadded.model_runner.v_cache)):
        # (inductor's kernels against eager: ~1e-4 apart; a padding row's write would be a whole slot apart)
        torch.testing.assert_close(padded_pool[:, :runner.num_blocks], pool, rtol=1e-3, atol=1e-3)
