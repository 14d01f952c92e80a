"""Tandem's weight-only INT8 kernel (int8_matvec.c through int8_linear.MatVecInt8Linear) on its own: values against
the dequantized weight's float product on both instruction sets, with and without bias, at row lengths that are not
a multiple of the vector width, at every step size up to and past the dequantized GEMM's; batch invariance; the
RMSNorm it applies on the way in; and the int8 matrix held once."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine import int8_linear
from inference.engine.int8_linear import GEMM_TOKENS, MatVecInt8Linear
from inference.engine.quantization import quantize_per_row

ISAS = ["avx512f", "avx2+fma"]


@pytest.fixture(params=ISAS)
def library(request):
    library, reason = int8_linear.load()
    if library is None:
        pytest.skip(reason)
    if library.cap_isa(request.param) != request.param:
        library.cap_isa("avx512f")
        pytest.skip(f"this CPU has no {request.param}")
    yield library
    library.cap_isa("avx512f")  # the widest the CPU has, as loaded


def _linear(library, out_features: int, in_features: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    w_int8, scale = quantize_per_row(weight)
    return MatVecInt8Linear(library, w_int8, scale, b), w_int8, scale, b


def _reference(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
    # in float64: the kernel's float32 sums may differ from it only by float32 rounding
    y = x.double() @ (w_int8.double() * scale.double()[:, None]).T
    return y if bias is None else y + bias.double()


def _assert_within_float32_rounding(got: torch.Tensor, x: torch.Tensor, w_int8: torch.Tensor,
                                    scale: torch.Tensor, bias: torch.Tensor | None):
    expected = _reference(x, w_int8, scale, bias)
    # a float32 sum of K products errs by at most ~K ulps of the sum of their magnitudes
    magnitude = x.double().abs() @ (w_int8.double().abs() * scale.double()[:, None]).T
    bound = x.shape[-1] * 2.0 ** -24 * magnitude + 1e-6
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert ((got.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("in_features", [576, 100, 23, 7], ids=lambda k: f"K{k}")
def test_the_kernel_is_the_dequantized_weights_float_product(library, bias, in_features):
    module, w_int8, scale, b = _linear(library, 37, in_features, bias)
    for num_tokens in (1, 2, 3, 4, 5, 16, 17, 40):
        x = torch.randn(num_tokens, in_features)
        assert module.runs(x)
        _assert_within_float32_rounding(module(x), x, w_int8, scale, b)


def test_a_step_of_gemm_tokens_or_more_runs_the_dequantized_gemm_with_the_same_values(library):
    module, w_int8, scale, b = _linear(library, 48, 96, bias=True)
    x = torch.randn(GEMM_TOKENS, 96)
    assert not module.runs(x)
    torch.testing.assert_close(module(x), F.linear(x, w_int8.float() * scale[:, None], b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module(x), torch.cat([module(x[i:i + 4]) for i in range(0, len(x), 4)]),
                               rtol=1e-5, atol=1e-5)


def test_a_token_gets_the_same_kernel_output_bit_for_bit_alone_or_in_any_step(library):
    module, *_ = _linear(library, 64, 200, bias=True)
    x = torch.randn(19, 200)
    x[4] *= 300  # a token with huge activations changes nothing for the others (nothing is quantized per step)
    step = module(x)
    assert torch.equal(step, torch.cat([module(x[i:i + 1]) for i in range(len(x))]))
    assert torch.equal(step[:3], module(x[:3]))


def test_inputs_of_any_shape_and_a_bfloat16_input_get_the_float32_inputs_values(library):
    module, *_ = _linear(library, 32, 64, bias=False)
    x = torch.randn(2, 3, 64)
    assert torch.equal(module(x), module(x.reshape(6, 64)).view(2, 3, 32))
    strided = torch.randn(3, 128)[:, :64]  # rows not contiguous: the kernel reads each at its stride
    assert torch.equal(module(strided), module(strided.contiguous()))
    half = x.bfloat16()
    assert module(half).dtype == torch.bfloat16
    assert torch.equal(module(half), module(half.float()).bfloat16())


def test_the_kernel_rms_normalizes_its_input_as_the_lean_forward_does(library):
    module, w_int8, scale, b = _linear(library, 40, 96, bias=True)
    x, weight = torch.randn(3, 96) * 5, torch.rand(96) + 0.5
    normed = F.rms_norm(x, (96,), weight, 1e-5)
    torch.testing.assert_close(module.kernel(x, (weight, 1e-5)), module(normed), rtol=1e-5, atol=1e-5)


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
