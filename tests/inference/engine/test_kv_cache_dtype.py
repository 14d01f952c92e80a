"""A KV cache narrower than the model (Config.kv_cache_dtype): a float32 model with a float16 or bfloat16 cache holds
twice the tokens in the same bytes, says so (kv_layout, the engine's kv_cache_dtype), rounds each K and V value once on
its way in on every path that writes the cache (the prefill, the lean decode forward, the decode layers in C), serves
the same greedy tokens through Tandem's paged kernel as through torch's attention over it, and refuses a cache dtype
that does not suit the model's before loading it."""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.config import ConfigError
from inference.engine.precision import KVDtypeError, choose_kv_dtype
from tests.inference.engine.support import prefilled, random_prompts

POOL_BYTES = 4 << 20


def _engine(model, kv_cache_dtype: str, **settings) -> LLMEngine:
    return LLMEngine(Config(model=model, dtype="float32", threads=1, kv_cache_bytes=POOL_BYTES, prefix_caching=False,
                            kv_cache_dtype=kv_cache_dtype, **settings))


@pytest.mark.parametrize("kv_cache_dtype", ["float16", "bfloat16"])
def test_a_16_bit_cache_holds_twice_the_tokens_in_the_same_bytes_and_says_so(tiny_model_dir, kv_cache_dtype):
    wide, narrow = _engine(tiny_model_dir, "auto"), _engine(tiny_model_dir, kv_cache_dtype)
    assert narrow.model_runner.num_blocks == 2 * wide.model_runner.num_blocks
    assert narrow.model_runner.k_cache.dtype == getattr(torch, kv_cache_dtype)
    assert (narrow.dtype, narrow.kv_cache_dtype, narrow.kv_layout["dtype"]) == ("float32", kv_cache_dtype,
                                                                               kv_cache_dtype)
    assert (wide.kv_cache_dtype, wide.kv_layout["dtype"]) == ("float32", "float32")
    assert "half the bytes" in narrow.kv_cache_dtype_reason and wide.kv_cache_dtype_reason.startswith("auto")


# How a decode step writes its K and V: the decode layers in one C call (the default where Tandem's kernels run), the
# lean forward's tensor ops, and torch's ops throughout (reference forward, torch's matmul and attention).
WRITERS = {"fused": {}, "lean": {"fused_decode": False},
           "torch": {"matvec": "torch", "lean_decode": False}}


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kv_cache_dtype", ["float16", "bfloat16"])
def test_each_k_and_v_value_is_the_float32_one_rounded_once(tiny_model_dir, writer, kv_cache_dtype):
    """The prompt's K/V (computed before any attention reads the cache: one chunk) and the first decode step's K/V
    of layer 0 (computed from the token's embedding alone) are the float32 engine's, rounded to the cache's dtype as
    torch's .to rounds them; later values differ (their attention read rounded K/V)."""
    prompts = random_prompts([21, 9], seed=5)
    engines = {kv: _engine(tiny_model_dir, kv, **WRITERS[writer]) for kv in ("auto", kv_cache_dtype)}
    slots = {}
    for kv, eng in engines.items():
        seqs = prefilled(eng, prompts)
        if writer == "fused":
            assert eng.model_runner.lean_decoder.fused is not None
        eng.step()  # one decode step of both sequences
        runner = eng.model_runner
        # per prompt length: the slots of the prompt's tokens and of the first decode step's
        slots[kv] = {seq.num_prompt_tokens: [seq.block_table[i // runner.block_size] * runner.block_size
                                             + i % runner.block_size for i in range(seq.num_prompt_tokens + 1)]
                     for seq in seqs}
    wide, narrow = (engines[kv].model_runner for kv in ("auto", kv_cache_dtype))
    dtype = getattr(torch, kv_cache_dtype)
    assert sorted(slots["auto"]) == sorted(slots[kv_cache_dtype]) == sorted(map(len, prompts))
    for length, s_wide in slots["auto"].items():
        s_narrow = slots[kv_cache_dtype][length]
        for cache in ("k_cache", "v_cache"):
            w = getattr(wide, cache).view(wide.num_layers, -1, wide.num_kv_heads, wide.head_dim)
            n = getattr(narrow, cache).view(narrow.num_layers, -1, narrow.num_kv_heads, narrow.head_dim)
            prompt_w, prompt_n = w[:, s_wide[:length]], n[:, s_narrow[:length]]
            assert prompt_n.dtype == dtype and torch.equal(prompt_n, prompt_w.to(dtype)), (cache, "prompt")
            decoded_w, decoded_n = w[0, s_wide[length]], n[0, s_narrow[length]]
            assert decoded_w.abs().sum() > 0, "the first decode step's K/V were written"
            assert torch.equal(decoded_n, decoded_w.to(dtype)), (cache, "first decode step, layer 0")


def test_greedy_tokens_over_a_float16_cache_are_the_same_with_the_kernel_and_with_torchs_attention(tiny_model_dir):
    prompts = random_prompts([3, 17, 33, 64, 9, 21], seed=11)
    outputs = []
    for matvec in ("auto", "torch"):
        eng = _engine(tiny_model_dir, "float16", matvec=matvec)
        assert eng.model_runner.decode_attention_info["kernel"] == ("tandem" if matvec == "auto" else "torch")
        outputs.append(eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True)))
    assert outputs[0] == outputs[1]


def test_a_cache_dtype_that_does_not_suit_the_model_is_refused_before_the_load(tiny_model_dir):
    assert choose_kv_dtype("auto", "bfloat16").name == "bfloat16"
    assert choose_kv_dtype("bfloat16", "bfloat16").name == "bfloat16"
    for requested, model in (("float16", "bfloat16"), ("float32", "bfloat16"), ("bfloat16", "float16")):
        with pytest.raises(KVDtypeError, match=f"kv_cache_dtype {requested} does not suit a model that runs in "
                                               f"{model}"):
            choose_kv_dtype(requested, model)
    with pytest.raises(KVDtypeError, match="does not suit a model that runs in bfloat16"):
        LLMEngine(Config(model=tiny_model_dir, dtype="bfloat16", kv_cache_dtype="float16", threads=1,
                         kv_cache_bytes=POOL_BYTES))
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, float32, bfloat16, float16, got 'fp8'"):
        Config(model=tiny_model_dir, kv_cache_dtype="fp8")
