"""Tandem's INT8 kernel (int8_matvec.c through int8_linear.MatVecInt8Linear) on its own: values against the float64
product of the dequantized weight with the activations rounded to int16 per token as the kernel rounds them, with
and without bias, at row lengths that are not a multiple of the vector width or past the int32 accumulators' chunk,
at every step size up to and past the dequantized GEMM's; batch invariance; zero and non-finite tokens; the RMSNorm
it applies on the way in; and the int8 matrix held once."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kernels import int8_linear
from inference.engine.kernels.int8_linear import GEMM_TOKENS, MatVecInt8Linear, dequantized_linear
from inference.engine.quantization import quantize_per_row


@pytest.fixture(params=["avx2", "vnni"])
def library(request):
    """The kernel with AVX2's multiply-add, and with AVX512-VNNI's where the CPU has it (switched, then restored)."""
    library, reason = int8_linear.load()
    if library is None:
        pytest.skip(reason)
    before = library.vnni
    if library.use_vnni(request.param == "vnni") != (request.param == "vnni"):
        library.use_vnni(before)
        pytest.skip("this CPU has no AVX512-VNNI")
    yield library
    library.use_vnni(before)


@pytest.mark.parametrize("tokens", [1, 3, 4, 5, 16, 17, 40])
def test_vnni_and_avx2_multiply_adds_give_the_same_values_bit_for_bit(tokens):
    """vpdpwssd adds the same wrapping int32 products as madd then add: the same exact sums, whatever the step, over a
    row past the int32 chunk and not a multiple of 16 long."""
    library, reason = int8_linear.load()
    if library is None:
        pytest.skip(reason)
    before = library.vnni
    if not library.use_vnni(True):
        pytest.skip("this CPU has no AVX512-VNNI")
    try:
        layer = _linear(library, 37, 4096 + 40, bias=True, seed=tokens)[0]
        x = torch.randn(tokens, 4096 + 40, generator=torch.Generator().manual_seed(tokens)) * 3
        with_vnni = layer(x)
        assert not library.use_vnni(False)
        assert torch.equal(layer(x), with_vnni)
    finally:
        library.use_vnni(before)


def test_the_kernel_runs_avx2_on_every_cpu_that_has_it():
    """One instruction set (an AVX-512 CPU runs the AVX2 kernel too), so every CPU computes the same values."""
    library, reason = int8_linear.load()
    if library is None:
        pytest.skip(reason)
    assert library.isa == "avx2+fma"
    assert library.cap_isa("avx512f") == "avx2+fma"


def _linear(library, out_features: int, in_features: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    w_int8, scale = quantize_per_row(weight)
    return MatVecInt8Linear(library, w_int8, scale, b), w_int8, scale, b


def _int16_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token rounded to int16 as the kernel rounds it: scale max|x| / 32767, x * (32767 / max|x|) in float32
    rounded to nearest even."""
    # x: [T, K] float32  ->  xq: [T, K] (int16 values, float64), scale: [T, 1] float32
    amax = x.abs().amax(-1, keepdim=True)
    inv = (32767.0 / amax.double()).float()  # the float32 quotient, correctly rounded (as C's 32767.0f / amax)
    return torch.round(x * inv).clamp(-32767, 32767).double(), amax / 32767.0


def _reference(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    # in float64, exact but for the last bits: the kernel's integer sums are exact, then rounded to float32 once
    xq, x_scale = _int16_tokens(x)
    y = (xq @ w_int8.double().T) * (x_scale.double() * scale.double()[None, :])
    return y if bias is None else y + bias.double()


def _assert_within_float32_rounding(got: torch.Tensor, x: torch.Tensor, w_int8: torch.Tensor,
                                    scale: torch.Tensor, bias: torch.Tensor | None):
    expected = _reference(x, w_int8, scale, bias)
    # four float32 roundings after the exact sum: to float, the two scales' product, the product, the bias
    no_bias = _reference(x, w_int8, scale, None).abs()
    bound = 2.0 ** -22 * (no_bias + (0 if bias is None else bias.double().abs())) + 1e-30
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert ((got.double() - expected).abs() <= bound).all()


def _assert_within_int16_rounding_of_float(got: torch.Tensor, x: torch.Tensor, w_int8: torch.Tensor,
                                           scale: torch.Tensor, bias: torch.Tensor | None):
    """The float activations' product lies within half an int16 step per activation of the kernel's."""
    exact = x.double() @ (w_int8.double() * scale.double()[:, None]).T
    exact = exact if bias is None else exact + bias.double()
    step = x.double().abs().amax(-1, keepdim=True) / 32767
    bound = 0.5 * step * (w_int8.double().abs() * scale.double()[:, None]).sum(-1)[None, :] * (1 + 1e-5) + 1e-5
    assert ((got.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("in_features", [576, 100, 23, 7], ids=lambda k: f"K{k}")
def test_the_kernel_is_the_dequantized_weights_product_with_int16_rounded_tokens(library, bias, in_features):
    module, w_int8, scale, b = _linear(library, 37, in_features, bias)
    for num_tokens in (1, 2, 3, 4, 5, 16, 17, 40):
        x = torch.randn(num_tokens, in_features)
        assert module.runs(x)
        _assert_within_float32_rounding(module(x), x, w_int8, scale, b)
        _assert_within_int16_rounding_of_float(module(x), x, w_int8, scale, b)


def test_rows_longer_than_the_int32_chunk_at_full_scale_sum_exactly(library):
    """Every weight +-127 and every activation +-32767 of the same sign: the largest sums, past one chunk (4096)."""
    in_features = 3 * 4096 + 37
    w_int8 = torch.full((5, in_features), 127, dtype=torch.int8)
    w_int8[1] = -127
    scale = torch.ones(5)
    module = MatVecInt8Linear(library, w_int8, scale)
    x = torch.ones(3, in_features)
    x[1] = -1
    expected = (x.double() @ w_int8.double().T).float()  # xq = +-32767, scale 1 / 32767: exact
    torch.testing.assert_close(module(x), expected, rtol=1e-6, atol=0)
    x = torch.randn(4, in_features)
    _assert_within_float32_rounding(module(x), x, w_int8, scale, None)


def test_a_zero_token_gives_the_bias_and_a_non_finite_token_gives_nan_without_touching_the_others(library):
    module, *_ = _linear(library, 24, 64, bias=True)
    x = torch.randn(4, 64)
    alone = module(x)
    x[1], x[2, 5], x[3, 7] = 0, float("nan"), float("inf")
    y = module(x)
    assert torch.equal(y[1], module.bias) and y[2:].isnan().all()
    assert torch.equal(y[0], alone[0])


def test_a_step_of_gemm_tokens_or_more_runs_the_dequantized_gemm_with_the_same_values(library):
    module, w_int8, scale, b = _linear(library, 48, 96, bias=True)
    x = torch.randn(GEMM_TOKENS, 96)
    assert not module.runs(x)
    torch.testing.assert_close(module(x), F.linear(x, w_int8.float() * scale[:, None], b), rtol=1e-5, atol=1e-5)
    # the kernel's int16-rounded tokens: within half an int16 step per activation of the GEMM's float ones
    _assert_within_int16_rounding_of_float(torch.cat([module(x[i:i + 4]) for i in range(0, len(x), 4)]), x, w_int8,
                                           scale, b)


def test_a_token_gets_the_same_kernel_output_bit_for_bit_alone_or_in_any_step(library):
    module, *_ = _linear(library, 64, 200, bias=True)
    x = torch.randn(19, 200)
    x[4] *= 300  # a token with huge activations changes nothing for the others (each token has its own scale)
    step = module(x)
    assert torch.equal(step, torch.cat([module(x[i:i + 1]) for i in range(len(x))]))
    assert torch.equal(step[:3], module(x[:3]))


def test_inputs_of_any_shape_and_a_bfloat16_input_get_the_float32_inputs_values(library):
    """A bfloat16 input runs the kernel (it reads float32 only) on its float32 values, as a long step's dequantized
    GEMM does."""
    module, w_int8, scale, _ = _linear(library, 32, 64, bias=False)
    x = torch.randn(2, 3, 64)
    assert torch.equal(module(x), module(x.reshape(6, 64)).view(2, 3, 32))
    strided = torch.randn(3, 128)[:, :64]  # rows not contiguous: the kernel reads each at its stride
    assert torch.equal(module(strided), module(strided.contiguous()))
    half = x.bfloat16()
    assert module(half).dtype == torch.bfloat16
    assert torch.equal(module(half), module(half.float()).bfloat16())
    long = torch.randn(GEMM_TOKENS, 64).bfloat16()
    assert torch.equal(module(long), dequantized_linear(long.float(), w_int8, scale, None).bfloat16())


def test_the_kernel_rms_normalizes_its_input_as_the_lean_forward_does(library):
    # The kernel's normalized values may differ from torch's by a float32 ulp, and an activation lying at half an
    # int16 step may then round to the other step: so against the float product, within int16 rounding (an
    # unseeded draw failed a 1e-5 tolerance against the module's own rounding of torch's values once in four runs).
    module, w_int8, scale, b = _linear(library, 40, 96, bias=True)
    g = torch.Generator().manual_seed(5)
    x, weight = torch.randn(3, 96, generator=g) * 5, torch.rand(96, generator=g) + 0.5
    normed = F.rms_norm(x, (96,), weight, 1e-5)
    got = module.kernel(x, (weight, 1e-5))
    _assert_within_int16_rounding_of_float(got, normed, w_int8, scale, b)
    torch.testing.assert_close(got, module(normed), rtol=1e-4, atol=1e-3)


def test_the_module_holds_the_int8_matrix_it_was_given_and_no_other_copy(library):
    _, w_int8, scale, _ = _linear(library, 64, 128, bias=False)
    module = MatVecInt8Linear(library, w_int8, scale)
    assert module.weight_int8.data_ptr() == w_int8.data_ptr() and module.scale.data_ptr() == scale.data_ptr()
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in module.buffers()}
    assert sum(held.values()) == 64 * 128 + 64 * 4


def test_threads_split_the_rows_and_change_no_value(library):
    module, *_ = _linear(library, 512, 1024, bias=True)  # big enough for the kernel to split it between threads
    x = torch.randn(5, 1024)
    module.num_threads = 1
    alone = module(x)
    module.num_threads = 2
    assert torch.equal(module(x), alone)
