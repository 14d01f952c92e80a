"""The int8 modules on their own: per-row quantization, the fbgemm and weight-only linears against the float linear,
batch invariance, the shared int8 matrix of a tied embedding and lm_head, and the bytes the weights take."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from inference.engine.quantization import (
    FbgemmInt8Linear, Int8Embedding, Int8Matrix, Int8TiedLMHead, WeightOnlyInt8Linear, quantize_model,
    quantize_per_row, weight_bytes)
from tests.conftest import MODELS_DIR

SMOLLM2 = MODELS_DIR / "smollm2-135m"


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return nn.Linear(192, 320, bias=True)


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_per_row_quantization_is_within_half_a_step_of_each_weight(linear):
    w_int8, scale = quantize_per_row(linear.weight)
    assert w_int8.dtype == torch.int8 and scale.shape == (320,)
    error = (w_int8.float() * scale[:, None] - linear.weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-7).all()
    assert w_int8.abs().amax(dim=1).eq(127).all()  # each row uses its whole range


@pytest.mark.parametrize("module_type", [FbgemmInt8Linear, WeightOnlyInt8Linear])
def test_an_int8_linear_stays_close_to_the_float_linear(linear, module_type):
    x = torch.randn(5, 3, 192)
    with torch.inference_mode():
        expected = linear(x)
        got = module_type.from_linear(linear)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    # fbgemm also quantizes the activations (per token, 8 bits); weight-only does not.
    assert _relative_error(got, expected) < (0.02 if module_type is FbgemmInt8Linear else 0.005)


def test_the_weight_only_linear_is_exactly_a_matmul_with_the_dequantized_weight(linear):
    module = WeightOnlyInt8Linear.from_linear(linear)
    x = torch.randn(4, 192)
    dequantized = module.weight_int8.float() * module.scale[:, None]
    torch.testing.assert_close(module(x), F.linear(x, dequantized, linear.bias), rtol=1e-5, atol=1e-5)


def test_a_token_gets_the_same_fbgemm_output_alone_or_in_any_batch(linear):
    module = FbgemmInt8Linear.from_linear(linear)
    x = torch.randn(9, 192)
    x[4] *= 300  # one token with huge activations must not coarsen the others
    batched = module(x)
    alone = torch.cat([module(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(batched, alone)
    assert _relative_error(batched[0], linear(x[0]).detach()) < 0.02


def test_an_fbgemm_linear_answers_a_bfloat16_input_in_bfloat16_with_the_float32_inputs_values(linear):
    module = FbgemmInt8Linear.from_linear(linear)
    x = torch.randn(3, 192).bfloat16()
    got = module(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, module(x.float()).bfloat16())


def test_a_tied_matrix_serves_the_embedding_and_the_lm_head_from_one_int8_table():
    torch.manual_seed(1)
    table = torch.randn(1000, 64)
    matrix = Int8Matrix(table)
    embedding = Int8Embedding(matrix, torch.float32)
    ids = torch.tensor([[0, 5, 999], [3, 3, 7]])
    rows = embedding(ids)
    assert rows.shape == (2, 3, 64)
    assert (rows - table[ids]).abs().max() <= matrix.scale.max() / 2 + 1e-6
    x = torch.randn(3, 64)
    fast, reference = Int8TiedLMHead(matrix, "int_mm")(x), Int8TiedLMHead(matrix, "weight_only")(x)
    assert _relative_error(fast, x @ table.T) < 0.02
    assert _relative_error(reference, x @ table.T) < 0.01
    assert torch.equal(fast[1:2], Int8TiedLMHead(matrix, "int_mm")(x[1:2]))  # per token: batch-invariant


def test_the_tiny_models_int8_weights_take_under_a_third_of_its_float32_ones(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    float_bytes = weight_bytes(model)
    assert float_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    quantize_model(model, kernel="fbgemm")
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert weight_bytes(model) <= 0.3 * float_bytes


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="SmolLM2 is not prepared")
@pytest.mark.parametrize("kernel", ["fbgemm", "weight_only"])
def test_smollm2_int8_weights_take_at_most_0_3x_of_float32_tied_embedding_included(kernel):
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: held once in float32 too
    float_bytes = weight_bytes(model)
    quantize_model(model, kernel=kernel)
    assert model.lm_head.matrix is model.model.embed_tokens.matrix  # and once in int8
    assert weight_bytes(model) <= 0.3 * float_bytes


def test_an_unknown_kernel_is_refused(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="kernel must be one of fbgemm, weight_only"):
        quantize_model(model, kernel="int4")


def test_without_vnni_fbgemm_takes_7_bit_activations_and_stays_close_and_batch_invariant(linear, monkeypatch):
    from inference.engine import quantization

    monkeypatch.setattr(quantization, "cpu_flags", lambda: frozenset({"avx2"}))
    module = FbgemmInt8Linear.from_linear(linear)
    assert module.reduce_range is True
    x = torch.randn(6, 192)
    x[2] *= 100
    batched = module(x)
    assert torch.equal(batched, torch.cat([module(x[i:i + 1]) for i in range(len(x))]))
    assert _relative_error(batched, linear(x).detach()) < 0.03
