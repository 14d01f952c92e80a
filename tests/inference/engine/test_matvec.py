"""Tandem's matrix-vector kernel (inference/engine/kernels/matvec.c): its products equal torch's within float32 rounding
(bfloat16: within one rounding of the output), each linear of a group writes its own columns, steps of more tokens
than the library's max_tokens_for(dtype) (32, in tiles above 4; bfloat16 in AVX512-BF16 tiles at every step where the
CPU has them, 8 where it has AMX or computes bfloat16 without them) are torch's own; the engine serves the same greedy
tokens with it as with torch's matmul; `auto` takes it where it can run and says why not elsewhere; without a C
compiler the engine keeps torch's matmul."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.kernels import build as kernel_build
from inference.engine.kernels import decode_layers, matvec, paged_attention
from inference.engine.interleave import Arrivals, Pause
from inference.engine.lean_decode import normed_projection, rms_norm
from tests.inference.engine.support import random_prompts

# CI machines have AVX2 and FMA at least: the kernel must run there (a CPU without both keeps torch's matmul).
pytestmark = pytest.mark.skipif(matvec.load()[0] is None, reason=f"matvec kernel unavailable: {matvec.load()[1]}")


def _linear(in_features: int, out_features: int, dtype: torch.dtype, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype).requires_grad_(False)


@contextlib.contextmanager
def _kernels(library: matvec.Library, name: str):
    """The library running `name`'s kernels (avx2+fma, avx512f, avx512_bf16: AVX-512F with the AVX512-BF16 tiles for
    bfloat16), restored after; skips where the CPU has not got them."""
    widest = library.isa
    try:
        if library.cap_isa("avx512f" if name == "avx512_bf16" else name) != name.replace("_bf16", "f"):
            pytest.skip(f"this CPU has no {name}")
        if library.use_bfloat16_tiles(name == "avx512_bf16") != (name == "avx512_bf16"):
            pytest.skip("this CPU has no AVX512-BF16")
        yield library
    finally:
        library.cap_isa(widest)
        library.use_bfloat16_tiles(True)


@pytest.fixture
def isa(request):
    """Each kernel the CPU can run: the AVX2 one too on an AVX-512 CPU, the AVX-512F one for bfloat16 too on a CPU
    with AVX512-BF16 (capped, then restored)."""
    with _kernels(matvec.load()[0], request.param):
        yield request.param


# (kernels, dtype) for the tests over each kernel: the AVX512-BF16 tiles are bfloat16's alone
KERNELS = pytest.mark.parametrize(
    "isa, dtype", [(isa, dtype) for isa in ("avx2+fma", "avx512f") for dtype in (torch.float32, torch.bfloat16)]
    + [("avx512_bf16", torch.bfloat16)], indirect=["isa"],
    ids=["avx2-float32", "avx2-bfloat16", "avx512f-float32", "avx512f-bfloat16", "avx512_bf16-bfloat16"])


@KERNELS
@pytest.mark.parametrize("in_features", [64, 70, 576])  # 70: rows that end inside a vector
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("out_features", [96, 97, 98, 99, 101])  # tiles of 3 (AVX2) and 6 rows (AVX-512), remainders
def test_its_products_equal_torchs_within_rounding(isa, dtype, in_features, bias, out_features):
    linear = _linear(in_features, out_features, dtype, bias, seed=in_features)
    projection = matvec.matvec_projection(matvec.load()[0], linear)
    assert isinstance(projection, matvec.MatVecLinear)
    for num_tokens in range(1, matvec.load()[0].max_tokens_for(dtype) + 1):
        x = torch.randn(num_tokens, in_features).to(dtype)
        exact = F.linear(x.double(), linear.weight.double(), None if linear.bias is None else linear.bias.double())
        got = projection(x)
        assert got.dtype == dtype and got.shape == (num_tokens, out_features)
        if dtype == torch.float32:
            # float32 sums of in_features products, in another order than MKL's: a few ulps of the magnitudes summed
            scale = (x.double().abs() @ linear.weight.double().abs().t()).max()
            assert (got.double() - exact).abs().max() <= 1e-6 * scale
        else:
            # products and sums in float32, then rounded once: within one bfloat16 rounding (2^-8 relative) plus the
            # float32 summation's own error, as torch's bfloat16 linear
            ours = (got.double() - exact).abs()
            torchs = (F.linear(x, linear.weight, linear.bias).double() - exact).abs()
            assert (ours <= exact.abs() * 2 ** -8 + 1e-3).all()
            assert ours.mean() <= 1.5 * torchs.mean() + 1e-6


@KERNELS
def test_an_rms_normalized_input_equals_the_lean_forwards_norm_then_the_product(isa, dtype):
    linear = _linear(576, 192, dtype, False, seed=9)
    projection = matvec.matvec_projection(matvec.load()[0], linear)
    norm = (torch.rand(576).add(0.5).to(dtype), 1e-5)
    normed = normed_projection(projection, norm)
    for num_tokens in sorted({3, projection.library.max_tokens_for(dtype)}):  # up to 32 tokens in tiles
        x = (torch.randn(num_tokens, 576) * 4).to(dtype)
        expected = projection(rms_norm(x, norm))  # the lean forward's norm (Hugging Face's), then the kernel
        got = normed(x)
        if dtype == torch.float32:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        else:  # the normalized input is rounded to bfloat16 twice, as Hugging Face rounds it: a rare value 1 ulp off
            assert (got.float() - expected.float()).abs().max() <= expected.float().abs().max() * 2 ** -7
    # torch's own norm and matmul past the kernel's tokens
    more = torch.randn(projection.library.max_tokens_for(dtype) + 1, 576).to(dtype)
    assert torch.equal(normed(more), F.linear(rms_norm(more, norm), linear.weight))


def test_each_linear_of_a_group_writes_its_own_columns():
    q, k, v = (_linear(576, n, torch.float32, False, seed=n) for n in (576, 192, 192))
    group = matvec.matvec_projection(matvec.load()[0], q, k, v)
    x = torch.randn(3, 576)
    singles = [matvec.matvec_projection(matvec.load()[0], linear)(x) for linear in (q, k, v)]
    assert torch.equal(group(x), torch.cat(singles, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_group_past_the_kernels_tokens_writes_torchs_products_into_their_columns(dtype, bias):
    # torch's products straight into their columns of one output: the values torch.cat of F.linear gives
    q, k, v = (_linear(576, n, dtype, bias, seed=n) for n in (576, 192, 192))
    group = matvec.matvec_projection(matvec.load()[0], q, k, v)
    x = torch.randn(group.library.max_tokens_for(dtype) + 7, 576).to(dtype)
    assert not group.runs(x)
    expected = torch.cat([F.linear(x, linear.weight, linear.bias) for linear in (q, k, v)], dim=-1)
    assert torch.equal(group(x), expected)
    # a view with rows apart (a slice of a wider tensor) and a 3-D input: the same values
    wide = torch.randn(x.shape[0], 700).to(dtype)
    wide[:, :576] = x
    assert torch.equal(group(wide[:, :576]), expected)
    assert torch.equal(group(x.unsqueeze(0))[0], expected)


@KERNELS
def test_in_parts_for_a_step_that_may_pause_it_looks_at_the_flag_between_parts_and_computes_the_same(isa, dtype):
    """The LM head of a step that may pause (model_runner._sample): parts of PAUSE_ROWS rows, the flag looked at between
    them, each output as in one call, the bias and each linear's columns where they belong."""
    wide, narrow = _linear(96, 2 * matvec.PAUSE_ROWS + 100, dtype, True, seed=3), _linear(96, 40, dtype, True, seed=4)
    group = matvec.matvec_projection(matvec.load()[0], wide, narrow)
    norm = (torch.rand(96).add(0.5).to(dtype), 1e-5)
    arrivals, boundaries = Arrivals(), []
    pause = Pause(arrivals, lambda: boundaries.append(len(boundaries)))  # the flag stays up: every boundary calls
    for num_tokens in sorted({1, 5, group.library.max_tokens_for(dtype)}):
        x = torch.randn(num_tokens, 96).to(dtype)
        boundaries.clear()
        arrivals.lower()
        assert torch.equal(group.kernel(x, norm, pause), group.kernel(x, norm)), "not raised: the same values"
        assert boundaries == []
        arrivals.raise_()
        assert torch.equal(group.kernel(x, norm, pause), group.kernel(x, norm))
        assert len(boundaries) == 2, "three parts of the wide linear, the narrow one in one"


def test_a_step_of_more_tokens_than_max_tokens_is_torchs_own_matmul():
    gate, up = (_linear(64, 128, torch.float32, False, seed=s) for s in (1, 2))
    group = matvec.matvec_projection(matvec.load()[0], gate, up)
    x = torch.randn(group.library.max_tokens + 1, 64)
    assert torch.equal(group(x), torch.cat([F.linear(x, gate.weight), F.linear(x, up.weight)], dim=-1))


@pytest.mark.parametrize("wide_isa", ["avx2+fma", "avx512f", "avx512_bf16"])
def test_with_tiles_a_tokens_values_do_not_depend_on_the_other_tokens_of_its_step(wide_isa, monkeypatch):
    """The tiles (steps of 5-32 tokens: AVX2's 3 rows, AVX-512's 6; every bfloat16 step with AVX512-BF16) sum each row
    and token in one order, whatever the tile the token is in: a sequence's logits do not change with how many others
    share its decode step (within that range)."""
    dtype = torch.bfloat16 if wide_isa == "avx512_bf16" else torch.float32
    with _kernels(matvec.load()[0], wide_isa) as library:
        monkeypatch.setattr(library, "amx", False)  # with AMX bfloat16 steps above 8 go to oneDNN: the tiles' range
        assert library.max_tokens_for(dtype) >= 16
        projection = matvec.matvec_projection(library, _linear(70, 101, dtype, True, seed=11))
        x = torch.randn(16, 70).to(dtype)
        whole = projection(x)
        assert torch.equal(whole[:5], projection(x[:5]))
        assert torch.equal(whole[6:13], projection(x[6:13]))
        assert torch.equal(whole[9:], projection(x[9:]))
        if wide_isa == "avx512_bf16":  # one to four tokens run the same tiles
            assert torch.equal(whole[3:4], projection(x[3:4]))
            assert torch.equal(whole[12:15], projection(x[12:15]))


def test_bfloat16_steps_run_the_kernel_up_to_32_tokens_with_the_avx512_bf16_tiles_and_8_with_amx_beside(monkeypatch):
    """Where the AVX512-BF16 tiles run they beat oneDNN's bfloat16 GEMM up to 32 tokens (a Zen 4 EPYC); with AMX,
    oneDNN's AMX GEMM takes bfloat16 steps above 8 as before (the tiles unmeasured against it); float32 is 32 anyway."""
    library = matvec.load()[0]
    if not library.bfloat16_tiles:
        pytest.skip("this CPU has no AVX512-BF16")
    monkeypatch.setattr(library, "amx", False)  # as on a CPU without AMX (this one may have it)
    assert library.max_tokens_for(torch.bfloat16) == library.max_tokens_for(torch.float32) == matvec.WIDE_MAX_TOKENS
    assert "AVX512-BF16 tiles" in matvec.choose_matvec("auto", dtype=torch.bfloat16, device=torch.device("cpu"),
                                                       quantization="none")[1]
    monkeypatch.setattr(library, "amx", True)
    assert library.max_tokens_for(torch.bfloat16) == matvec.NATIVE_BFLOAT16_MAX_TOKENS
    assert library.max_tokens_for(torch.float32) == matvec.WIDE_MAX_TOKENS
    monkeypatch.setattr(library, "amx", False)
    with _kernels(library, "avx512f"):  # without the tiles: the AVX-512F kernel up to 8, as before
        assert library.max_tokens_for(torch.bfloat16) == matvec.NATIVE_BFLOAT16_MAX_TOKENS


def test_a_linear_the_kernel_cannot_read_is_left_to_torch():
    library = matvec.load()[0]
    transposed = _linear(64, 32, torch.float32, False, seed=3)
    transposed.weight = nn.Parameter(transposed.weight.t().contiguous().t(), requires_grad=False)  # [in, out] rows
    assert matvec.matvec_projection(library, transposed) is None
    assert matvec.matvec_projection(library, _linear(64, 32, torch.float16, False, seed=4)) is None
    assert matvec.matvec_projection(None, _linear(64, 32, torch.float32, False, seed=5)) is None


def test_auto_takes_the_kernel_for_float32_and_bfloat16_on_a_cpu_and_says_why_not_elsewhere():
    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        library, reason = matvec.choose_matvec("auto", dtype=dtype, device=cpu, quantization="none")
        assert library is not None and library.isa in ("avx2+fma", "avx512f") and library.isa in reason
    cases = [("torch", torch.float32, cpu, "none", "asked for"),
             ("auto", torch.float16, cpu, "none", "not float16"),
             ("auto", torch.float32, cpu, "int8", "int8 linears run their own kernels"),
             ("tandem", torch.float32, torch.device("cuda"), "none", "on cuda")]
    for setting, dtype, device, quantization, why in cases:
        library, reason = matvec.choose_matvec(setting, dtype=dtype, device=device, quantization=quantization)
        assert library is None and why in reason, reason


def test_without_a_c_compiler_the_engine_keeps_torchs_matmul_and_says_why(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing built yet
    monkeypatch.setattr(kernel_build, "INSTALLED", tmp_path / "installed")  # nor at install
    monkeypatch.setattr(kernel_build, "_status", {})
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    monkeypatch.delenv("CC", raising=False)
    # every kernel library the engine loads, so that none stays cached as missing for the tests after this one
    loaders = (matvec.load, paged_attention.load, decode_layers.load)
    for load in loaders:
        load.cache_clear()
    try:
        eng = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20, dtype="float32",
                               matvec="tandem"))
    finally:
        for load in loaders:
            load.cache_clear()
    assert eng.matvec["kernel"] == "torch" and "no C compiler found" in eng.matvec["reason"]
    assert kernel_build.status()["matvec"]["origin"] == "missing"
    assert len(eng.generate(random_prompts([5], seed=1), SamplingParams(max_tokens=4, ignore_eos=True))[0]) == 4


def test_the_engine_serves_the_same_greedy_tokens_with_the_kernel_and_with_torch(tiny_model_dir):
    prompts = random_prompts([3, 17, 33, 64, 9, 21], seed=11)
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs, engines = [], {}
    for setting in ("tandem", "torch"):
        eng = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=4 << 20, dtype="float32",
                               prefix_caching=False, matvec=setting))
        engines[setting] = eng.matvec
        outputs.append(eng.generate(prompts, greedy))  # six sequences: decode steps of up to six tokens
    assert engines["tandem"]["kernel"] == "tandem" and engines["torch"]["kernel"] == "torch"
    assert outputs[0] == outputs[1]
