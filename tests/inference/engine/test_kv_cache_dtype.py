"""A KV cache narrower than the model (Config.kv_cache_dtype): a float32 model with a float16 or bfloat16 cache holds
twice the tokens in the same bytes, says so (kv_layout, the engine's kv_cache_dtype), rounds each K and V value once on
its way in on every path that writes the cache (the prefill, the lean decode forward, the decode layers in C), serves
the same greedy tokens through Tandem's paged kernel as through torch's attention over it (and with layer drafts as
without), attends from chunks after a cached prefix as over the same values in float32, and refuses a cache dtype
that does not suit the model's before loading it."""
from __future__ import annotations

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.attention import PrefillAttention
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
    torch's .to rounds them; later values differ (their attention read rounded K/V). The prompts fill more rows than
    the C layers take, so that both engines prefill them through the same ops (over a narrower cache prompt rows
    never run there)."""
    prompts = random_prompts([21, 19], seed=5)
    engines = {kv: _engine(tiny_model_dir, kv, **WRITERS[writer]) for kv in ("auto", kv_cache_dtype)}
    slots = {}
    for kv, eng in engines.items():
        seqs = prefilled(eng, prompts)
        if writer == "fused":
            assert eng.model_runner.lean_decoder.fused is not None
        eng.step()  # one decode step of both sequences
        runner = eng.model_runner
        # per prompt length: the slots of the prompt's tokens and of the first decode step's
        slots[kv] = {seq.num_prompt_tokens: [seq.block_table[i // runner.pool.block_size] * runner.pool.block_size
                                             + i % runner.pool.block_size for i in range(seq.num_prompt_tokens + 1)]
                     for seq in seqs}
    wide, narrow = (engines[kv].model_runner for kv in ("auto", kv_cache_dtype))
    dtype = getattr(torch, kv_cache_dtype)
    assert sorted(slots["auto"]) == sorted(slots[kv_cache_dtype]) == sorted(map(len, prompts))
    for length, s_wide in slots["auto"].items():
        s_narrow = slots[kv_cache_dtype][length]
        for cache in ("k_cache", "v_cache"):
            shape = wide.shape
            w = getattr(wide, cache).view(shape.num_layers, -1, shape.num_kv_heads, shape.head_dim)
            n = getattr(narrow, cache).view(shape.num_layers, -1, shape.num_kv_heads, shape.head_dim)
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
        assert eng.model_runner.plan.decode_attention_info["kernel"] == ("tandem" if matvec == "auto" else "torch")
        outputs.append(eng.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True)))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("kv_cache_dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_chunks_over_a_narrow_cache_attend_as_over_the_same_values_widened(kv_cache_dtype):
    """Prefill attention of a step with two chunks after cached prefixes (chunked prefill, a prefix-cache hit, a
    speculative verify), layer after layer: over a float16 or bfloat16 cache it equals the same over a float32 cache
    holding the same values (the masks made in the cache's dtype are used in the queries' in every layer)."""
    g = torch.Generator().manual_seed(3)
    num_layers, num_blocks, block_size, h_q, h_kv, d = 3, 16, 4, 4, 2, 16
    k16, v16 = (torch.randn(num_layers, num_blocks, block_size, h_kv, d, generator=g).to(kv_cache_dtype)
                for _ in range(2))
    chunks = []  # (slots of positions [0, end), mask [1, 1, C, S]) of two sequences' chunks at [start, end)
    for first_block, start, end in ((1, 5, 9), (8, 3, 10)):
        slots = torch.arange(first_block * block_size, first_block * block_size + end)
        keys, queries = torch.arange(end), torch.arange(start, end)
        chunks.append((slots, (keys.unsqueeze(0) <= queries.unsqueeze(1)).view(1, 1, end - start, end)))
    bounds = [(0, 4), (4, 11)]
    q = torch.randn(11, h_q, d, generator=g)
    k, v = torch.randn(11, h_kv, d, generator=g), torch.randn(11, h_kv, d, generator=g)
    narrow = PrefillAttention(k16, v16, bounds, chunks)
    wide = PrefillAttention(k16.float(), v16.float(), bounds, chunks)
    for layer_id in range(num_layers):
        got = narrow(layer_id, q, k, v, 0.25)
        assert torch.equal(got, wide(layer_id, q, k, v, 0.25)), layer_id


def test_layer_drafts_over_a_float16_cache_keep_the_greedy_tokens(tiny_model_dir):
    """Self-speculation writes and verifies over the cache: with a float16 one its greedy tokens are still the
    engine's without speculation (several sequences verified in one step)."""
    prompts = random_prompts([3, 17, 33], seed=11)
    outputs = [_engine(tiny_model_dir, "float16", speculative=spec).generate(
                   prompts, SamplingParams(max_tokens=16, ignore_eos=True))
               for spec in (None, {"method": "layers", "num_tokens": 3, "layers": 1})]
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
