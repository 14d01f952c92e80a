"""Prepacked weights (`packed_weights`, inference/engine/packed_weights.py): steps of more tokens than Tandem's kernel
takes run oneDNN's GEMM over a copy packed once, whose products equal the dense ones within rounding, each linear of
a group in its own columns; the kernel's steps stay the kernel's; the engine serves the same greedy tokens as
without the setting, and /info says the weights are held twice; where the kernel does not run nothing is packed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine import packed_weights
from inference.engine.kernels import matvec
from inference.engine.packed_weights import PackedMatVecLinear, WeightPacker
from inference.hardware import cpu_has_native_bfloat16
from tests.inference.engine.support import random_prompts

pytestmark = pytest.mark.skipif(matvec.load()[0] is None, reason=f"matvec kernel unavailable: {matvec.load()[1]}")

DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not cpu_has_native_bfloat16() or not packed_weights.packs(torch.bfloat16), reason="no bfloat16 oneDNN here"))]
PACKED_OP = "mkldnn::_linear_pointwise"


@pytest.fixture(autouse=True)
def packs_here():
    if not packed_weights.packs(torch.float32):
        pytest.skip("this torch build has no oneDNN linear over packed weights")


def _linear(in_features: int, out_features: int, dtype: torch.dtype, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype).requires_grad_(False)


class OpNames(TorchDispatchMode):
    """The names of the tensor ops run inside it."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_a_step_of_many_tokens_equals_the_dense_product_within_rounding(dtype, bias):
    q, k, v = (_linear(576, n, dtype, bias, seed=n) for n in (576, 192, 192))
    packer = WeightPacker()
    projection = packer(matvec.matvec_projection(matvec.load()[0], q, k, v))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: one rounding of the output apart at most
    for num_tokens in (projection.library.max_tokens_for(dtype) + 1, 100):
        x = torch.randn(num_tokens, 576).to(dtype)
        with OpNames() as ops:
            got = projection(x)
        assert PACKED_OP in ops.names and "aten::mm" not in ops.names, ops.names
        expected = torch.cat([F.linear(x.float(), m.weight.float(), None if m.bias is None else m.bias.float())
                              for m in (q, k, v)], dim=-1)  # each its own columns
        assert got.shape == (num_tokens, 960) and got.dtype == dtype
        torch.testing.assert_close(got.float(), expected, rtol=tolerance, atol=tolerance)
        # a view with rows apart (a slice of a wider tensor) and a 3-D input: the same values
        wide = torch.zeros(num_tokens, 700, dtype=dtype)
        wide[:, :576] = x
        assert torch.equal(projection(wide[:, :576]), got)
        torch.testing.assert_close(projection(x.unsqueeze(0))[0].float(), expected, rtol=tolerance, atol=tolerance)
    assert packer.num_projections == 1
    assert packer.num_packed_bytes >= sum(m.weight.nbytes for m in (q, k, v))


@pytest.mark.parametrize("dtype", DTYPES)
def test_steps_the_kernel_takes_stay_the_kernels(dtype):
    linear = _linear(576, 192, dtype, False, seed=1)
    library = matvec.load()[0]
    kernel = matvec.matvec_projection(library, linear)
    projection = PackedMatVecLinear(kernel)
    for num_tokens in (1, library.max_tokens_for(dtype)):
        x = torch.randn(num_tokens, 576).to(dtype)
        with OpNames() as ops:
            got = projection(x)
        assert PACKED_OP not in ops.names
        assert torch.equal(got, kernel(x))


def _engines(model_dir, dtype: str, **settings) -> dict[bool, LLMEngine]:
    return {packed: LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=16 << 20, prefix_caching=False,
                                     dtype=dtype, packed_weights=packed, **settings)) for packed in (False, True)}


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=DTYPES[1].marks)])
def test_the_engine_prefills_and_decodes_a_batch_through_packed_weights_with_the_same_greedy_tokens(
        tiny_model_dir, dtype):
    # 36 sequences: decode steps past the kernel's tokens (32 in float32, 8 or 32 in bfloat16); a prompt of 300
    # tokens: prefill chunks of the default sizes
    engines = _engines(tiny_model_dir, dtype)
    prompts = random_prompts([3, 9, 17, 30, 41, 64, 5, 12, 22, 35, 8, 27, 50, 14, 19, 6, 33, 44] * 2, seed=7)
    prompts.append(random_prompts([300], seed=8)[0])
    packed = engines[True]
    for i, prompt in enumerate(prompts[:36]):  # long enough that none ends while the others' prompts are prefilled
        packed.add_request(f"r{i}", prompt, SamplingParams(max_tokens=64, ignore_eos=True))
    prefilled: set[str] = set()
    while len(prefilled) < 36:  # the prefill (in as many steps as the token budget takes)
        with OpNames() as ops:
            prefilled.update(out.request_id for out in packed.step())
        assert PACKED_OP in ops.names
    with OpNames() as ops:
        packed.step()  # a decode step of 36 tokens
    assert packed.num_step_tokens == 36
    assert PACKED_OP in ops.names and "aten::mm" not in ops.names, ops.names
    while packed.has_unfinished():
        packed.step()
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    assert packed.generate(prompts, params) == engines[False].generate(prompts, params)


def test_info_says_the_float_weights_are_held_twice(tiny_model_dir):
    engines = _engines(tiny_model_dir, "float32")
    plain, packed = engines[False].matvec["packed_weights"], engines[True].matvec["packed_weights"]
    assert plain == {"enabled": False, "packed_bytes": 0, "reason": plain["reason"]} and "off" in plain["reason"]
    assert packed["enabled"] and "held beside" in packed["reason"]
    assert engines[True].weight_bytes == engines[False].weight_bytes + packed["packed_bytes"]
    # every linear of the layers and lm_head once more (the embedding, untied here, and the norms are not)
    model = engines[False].model_runner.model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert packed["packed_bytes"] >= sum(m.weight.nbytes for m in linears)
    assert "oneDNN's GEMM over prepacked weights" in engines[True].matvec["reason"]


@pytest.mark.parametrize("settings, why", [
    ({"matvec": "torch"}, "matvec kernel does not run"),
    ({"quantization": "int8"}, "int8 weights are packed by their own kernels"),
    ({"lean_decode": False}, "lean_decode is off"),
], ids=["matvec_torch", "int8", "no_lean_decode"])
def test_where_the_kernel_or_the_lean_forward_does_not_run_nothing_is_packed(tiny_model_dir, settings, why):
    engines = _engines(tiny_model_dir, "float32", **settings)
    info = engines[True].matvec["packed_weights"]
    assert not info["enabled"] and why in info["reason"]
    assert engines[True].weight_bytes == engines[False].weight_bytes
    prompts = random_prompts([40, 7], seed=3)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    assert engines[True].generate(prompts, params) == engines[False].generate(prompts, params)
