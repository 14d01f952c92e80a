"""Tandem's prefill-attention kernel (inference/engine/kernels/prefill_attention.c): its output equals exact (float64) causal
attention within float32 rounding (bfloat16: within the rounding of the probabilities and of the output, as torch's
SDPA), for a chunk over its own K/V and a chunk after a cached prefix read in place from scattered cache rows, chunk
lengths off the query tiles and key counts off the blocks and pairs, grouped and ungrouped heads, head dims 16 to 128,
both instruction sets (float32: AVX2 and AVX-512F) and any thread count; the engine serves the same greedy tokens with
it as with torch's SDPA, through chunked prefill and a cached prefix; `auto` takes it where it runs and says why not
elsewhere."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.kernels import prefill_attention
from inference.engine.attention import PrefillAttention
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import capped_isa, random_prompts

LIBRARY, WHY = prefill_attention.load_kernel()
needs_kernel = pytest.mark.skipif(LIBRARY is None, reason=f"prefill attention kernel unavailable: {WHY}")
needs_bfloat16 = pytest.mark.skipif(LIBRARY is None or not LIBRARY.runs(torch.bfloat16),
                                    reason="the kernel's bfloat16 needs AVX512-BF16")
SMOLLM2 = MODELS_DIR / "smollm2-135m"


@pytest.fixture(params=["avx2+fma", "avx512f"])
def isa(request):
    """Each float32 kernel the CPU can run: the AVX2 one too on an AVX-512 CPU (capped, then restored)."""
    with capped_isa(LIBRARY, request.param):
        yield request.param


# (query heads, KV heads, head dim, chunk length C, position of its first query): a whole prompt (first 0) and chunks
# after a prefix; C off the query tiles (float32 on AVX-512: 32 in two vectors above 16 queries, 16 up to 16; on AVX2
# 16 in two above 8, 8 up to 8; bfloat16 16), first + C off the 64-key blocks and (odd) the bfloat16 pairs of keys.
CASES = {
    "prompt_grouped": (9, 3, 64, 300, 0),
    "prompt_one_token": (4, 2, 48, 1, 0),
    "prompt_ungrouped_d16": (4, 4, 16, 37, 0),
    "chunk_after_prefix": (9, 3, 64, 64, 193),
    "chunk_of_one_after_prefix": (2, 1, 128, 1, 70),
    "chunk_d48_odd_keys": (4, 2, 48, 23, 130),
    "multi_query_72_heads": (72, 1, 16, 9, 3),
    "multi_query_72_heads_two_vector_tiles": (72, 1, 16, 45, 3),
}


def _case(num_heads, num_kv_heads, head_dim, size, first, dtype, seed):
    """Queries as a strided view of a fused q/k/v projection (as the engine's are); the keys of positions
    [0, first + C) at scattered rows of a pool [N, Hkv, D], their slots."""
    g = torch.Generator().manual_seed(seed)
    fused = (torch.randn(size, num_heads + 2 * num_kv_heads, head_dim, generator=g) * 2).to(dtype)
    q = fused[:, :num_heads]
    num_keys = first + size
    pool_k = torch.randn(num_keys + 40, num_kv_heads, head_dim, generator=g).to(dtype)
    pool_v = torch.randn(num_keys + 40, num_kv_heads, head_dim, generator=g).to(dtype)
    slots = torch.randperm(num_keys + 40, generator=g)[:num_keys].contiguous()
    return q, pool_k, pool_v, slots, first


def _kernel(q, pool_k, pool_v, slots, first, num_threads=1):
    out = torch.empty(q.shape, dtype=q.dtype)
    return LIBRARY.attend(q, first, pool_k, pool_v, slots, 0.125, num_threads, out)


def _reference(q, pool_k, pool_v, slots, first, dtype):
    size, num_keys = q.shape[0], slots.numel()
    mask = torch.ones(size, num_keys, dtype=torch.bool).tril_(first)  # query first + i sees keys <= first + i
    q4, k4, v4 = (t.to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, pool_k[slots], pool_v[slots]))
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=0.125, enable_gqa=True)
    return out[0].transpose(0, 1)


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_float32_output_equals_exact_attention_within_rounding(isa, case):
    args = _case(*CASES[case], torch.float32, seed=len(case))
    got = _kernel(*args)
    exact = _reference(*args, torch.float64)
    assert got.dtype == torch.float32 and got.shape == args[0].shape
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, _reference(*args, torch.float32), rtol=1e-5, atol=1e-5)


@needs_bfloat16
@pytest.mark.parametrize("case", CASES)
def test_bfloat16_output_is_as_close_to_exact_attention_as_torchs(case):
    args = _case(*CASES[case], torch.bfloat16, seed=len(case))
    got, exact = _kernel(*args).double(), _reference(*args, torch.float64)
    torchs = _reference(*args, torch.bfloat16).double()
    # Both round the probabilities to bfloat16 before multiplying V (2^-9 relative each) and the output once:
    # within a few bfloat16 ulps of a head's output magnitude of the exact value, as torch's SDPA is.
    magnitude = exact.abs().amax(dim=-1, keepdim=True)  # [C, Hq, 1]
    assert ((got - exact).abs() <= magnitude * 2 ** -6).all()
    assert ((torchs - exact).abs() <= magnitude * 2 ** -6).all()  # the bound holds torch's own
    assert (got - exact).abs().mean() <= 2 * (torchs - exact).abs().mean() + 1e-6


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_threads_change_nothing(dtype):
    if not LIBRARY.runs(dtype):
        pytest.skip("the kernel's bfloat16 needs AVX512-BF16")
    # each (KV head, tile of queries) is computed by one thread whichever it is, in the same order: the same bits
    args = _case(9, 3, 64, 200, 100, dtype, seed=5)
    assert torch.equal(_kernel(*args, num_threads=2), _kernel(*args, num_threads=1))


@needs_kernel
def test_prefill_attention_runs_the_kernel_per_chunk_over_own_and_cached_keys(isa):
    """PrefillAttention with the kernel: two sequences in one step, one a whole prompt, one a chunk whose prefix is
    in a paged cache [L, N, bs, Hkv, D]; the chunk's own K/V read from the step's tensors and (for the second) from
    the cache where the layer wrote them; equal to torch's path within float32 rounding."""
    g = torch.Generator().manual_seed(7)
    layers, blocks, bs, h_kv, h_q, d = 2, 16, 16, 2, 4, 48
    k_cache, v_cache = (torch.randn(layers, blocks, bs, h_kv, d, generator=g) for _ in range(2))
    prompt, chunk, prefix = 21, 19, 40  # tokens
    step_k, step_v = (torch.randn(prompt + chunk, h_kv, d, generator=g) for _ in range(2))
    q = torch.randn(prompt + chunk, h_q, d, generator=g)
    slots = torch.randperm(blocks * bs, generator=g)[:prefix + chunk]  # the second sequence's positions 0 .. 58
    layer = 1
    k_cache[layer].view(-1, h_kv, d)[slots[prefix:]] = step_k[prompt:]  # the layer wrote the chunk's own K/V
    v_cache[layer].view(-1, h_kv, d)[slots[prefix:]] = step_v[prompt:]
    keys, queries = torch.arange(prefix + chunk), torch.arange(prefix, prefix + chunk)
    mask = (keys.unsqueeze(0) <= queries.unsqueeze(1)).view(1, 1, chunk, prefix + chunk)
    contexts = [None, (slots, mask)]
    bounds = [(0, prompt), (prompt, prompt + chunk)]
    torchs = PrefillAttention(k_cache, v_cache, bounds, contexts)(layer, q, step_k, step_v, 0.125)
    got = PrefillAttention(k_cache, v_cache, bounds, contexts, LIBRARY, 1)(layer, q, step_k, step_v, 0.125)
    torch.testing.assert_close(got, torchs, rtol=1e-5, atol=1e-5)
    # over a float16 cache (which the kernel does not read) the step keeps torch's path; a whole prompt alone runs
    # the kernel over the step's own K/V
    k16, v16 = k_cache.half(), v_cache.half()
    assert torch.equal(PrefillAttention(k16, v16, bounds, contexts, LIBRARY, 1)(layer, q, step_k, step_v, 0.125),
                       PrefillAttention(k16, v16, bounds, contexts)(layer, q, step_k, step_v, 0.125))
    whole = PrefillAttention(k16, v16, bounds[:1], [None], LIBRARY, 1)(layer, q[:prompt], step_k[:prompt],
                                                                        step_v[:prompt], 0.125)
    assert torch.equal(whole, got[:prompt])


def test_auto_takes_the_kernel_where_it_runs_and_says_why_not_elsewhere():
    cpu = torch.device("cpu")
    library, reason = prefill_attention.choose_prefill_attention("auto", dtype=torch.float32, device=cpu, head_dim=64)
    if LIBRARY is None:
        assert library is None and "AVX2 with FMA" in reason, reason
    else:
        assert library is LIBRARY and LIBRARY.isa in reason
        library, reason = prefill_attention.choose_prefill_attention("auto", dtype=torch.float32, device=cpu,
                                                                     head_dim=64, kv_dtype=torch.float16)
        assert library is LIBRARY and "float16 cache for whole prompts only" in reason, reason
    cases = [("torch", {}, "asked for"),
             ("tandem", {"device": torch.device("cuda")}, "on cuda"),
             ("auto", {"dtype": torch.float16}, "not float16"),
             ("auto", {"head_dim": 72}, "not 72")]
    for setting, change, why in cases:
        kwargs = {"dtype": torch.float32, "device": cpu, "head_dim": 64, **change}
        library, reason = prefill_attention.choose_prefill_attention(setting, **kwargs)
        assert library is None and why in reason, reason


@needs_kernel
def test_bfloat16_without_avx512_bf16_keeps_torchs_sdpa():
    with capped_isa(LIBRARY, "avx512f"):
        library, reason = prefill_attention.choose_prefill_attention(
            "auto", dtype=torch.bfloat16, device=torch.device("cpu"), head_dim=64)
        assert library is None and "AVX512-BF16" in reason, reason
        assert prefill_attention.choose_prefill_attention(
            "auto", dtype=torch.float32, device=torch.device("cpu"), head_dim=64)[0] is LIBRARY


@needs_bfloat16
def test_bfloat16_on_a_cpu_with_amx_keeps_torchs_sdpa_unless_the_kernel_is_asked_for(monkeypatch):
    # SDPA's bfloat16 flash kernel multiplies on AMX there (2-3x the kernel's AVX512-BF16 on a Xeon with AMX)
    cpu = torch.device("cpu")
    flags = prefill_attention.cpu_flags() | {"amx_bf16", "amx_tile"}
    monkeypatch.setattr(prefill_attention, "cpu_flags", lambda: flags)
    library, reason = prefill_attention.choose_prefill_attention("auto", dtype=torch.bfloat16, device=cpu, head_dim=64)
    assert library is None and "AMX" in reason, reason
    assert prefill_attention.choose_prefill_attention("tandem", dtype=torch.bfloat16, device=cpu,
                                                      head_dim=64)[0] is LIBRARY
    assert prefill_attention.choose_prefill_attention("auto", dtype=torch.float32, device=cpu, head_dim=64)[0] is LIBRARY
    monkeypatch.setattr(prefill_attention, "cpu_flags", lambda: flags - {"amx_bf16", "amx_tile"})
    assert prefill_attention.choose_prefill_attention("auto", dtype=torch.bfloat16, device=cpu,
                                                      head_dim=64)[0] is LIBRARY


def _greedy(model, prompts, num_new_tokens, *, kernel: bool, **settings) -> tuple[list[list[int]], LLMEngine]:
    eng = LLMEngine(Config(model=model, threads=1, **{"prefix_caching": False, **settings}))
    assert eng.matvec["prefill_attention"]["kernel"] == "tandem", eng.matvec
    if not kernel:  # torch's SDPA for the prefill chunks, everything else as is
        eng.model_runner.plan = replace(eng.model_runner.plan, prefill_attention=None)
    outputs = eng.generate(prompts, SamplingParams(max_tokens=num_new_tokens, ignore_eos=True))
    return outputs, eng


@needs_kernel
def test_the_engine_serves_the_same_greedy_tokens_with_the_kernel_and_with_torchs_sdpa(isa, tiny_model_dir):
    # Chunks of 16 (so prompts run over several steps, each chunk after its cached prefix), then the same prompts
    # again behind a cached prefix (prefix caching: the first chunk starts past position 0).
    prompts = random_prompts([70, 5, 33, 120], seed=21)
    settings = {"dtype": "float32", "kv_cache_bytes": 8 << 20, "prefill_chunk_size": 16,
                "prefill_chunk_size_alone": 16, "prefix_caching": True}
    runs = []
    for kernel in (True, False):
        outputs, eng = _greedy(tiny_model_dir, prompts, 16, kernel=kernel, **settings)
        hits = eng.block_manager.prefix_cache.num_hit_tokens
        again = eng.generate([p + [7, 8, 9] for p in prompts], SamplingParams(max_tokens=16, ignore_eos=True))
        assert eng.block_manager.prefix_cache.num_hit_tokens >= hits + 64  # the long prompts' full blocks
        runs.append((outputs, again))
    assert runs[0] == runs[1]


@needs_kernel
def test_matvec_torch_turns_the_kernel_off_and_info_says_so(tiny_model_dir):
    eng = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20, dtype="float32", matvec="torch"))
    assert eng.model_runner.plan.prefill_attention is None
    assert eng.matvec["prefill_attention"] == {"kernel": "torch", "reason": "torch: asked for (matvec torch)"}


@needs_kernel
@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason=f"SmolLM2 is not prepared at {SMOLLM2}")
def test_smollm2_float32_greedy_tokens_are_the_same_with_the_kernel_and_with_torchs_sdpa():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    text = "The history of the printing press begins in the fifteenth century, when " * 12
    prompts = [tokenizer.encode(text), tokenizer.encode("def fibonacci(n):\n    ")]
    # chunks of 64: the long prompt (157 tokens) runs in three, two of them after a cached prefix
    outputs = [_greedy(str(SMOLLM2), prompts, 24, kernel=kernel, dtype="float32", kv_cache_bytes=64 << 20,
                       prefill_chunk_size=64, prefill_chunk_size_alone=64)[0] for kernel in (True, False)]
    assert outputs[0] == outputs[1]
