"""oneDNN's GEMM for float32 CPU steps of more tokens than Tandem's kernel takes (inference/engine/gemm.py): its
products equal torch's within float32 rounding, each linear of a group writes its own columns, steps the kernel
takes stay the kernel's, bfloat16 keeps torch's (oneDNN already), and the engine runs a batched decode step and a
prefill through it with the same greedy tokens as torch's matmul."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine import gemm
from inference.engine.kernels import matvec
from tests.inference.engine.support import random_prompts

pytestmark = [pytest.mark.skipif(matvec.load()[0] is None, reason=f"matvec kernel unavailable: {matvec.load()[1]}"),
              pytest.mark.skipif(not gemm.onednn_runs(), reason="this torch build has no oneDNN linear")]


THE_RULE = gemm.onednn_preferred.__wrapped__  # the vendor rule itself, uncached


@pytest.fixture(autouse=True)
def onednn_preferred(monkeypatch):
    """oneDNN's path on any CPU (the engine keeps MKL's on an Intel CPU: the last test)."""
    monkeypatch.setattr(gemm, "onednn_preferred", lambda: True)


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


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_a_step_of_many_tokens_equals_torchs_product_within_float32_rounding(bias):
    q, k, v = (_linear(576, n, torch.float32, bias, seed=n) for n in (576, 192, 192))
    projection = gemm.kernel_projection(matvec.load()[0], q, k, v)
    assert isinstance(projection, gemm.GemmMatVecLinear)
    for num_tokens in (projection.library.max_tokens + 1, 100):
        x = torch.randn(num_tokens, 576)
        with OpNames() as ops:
            got = projection(x)
        assert "mkldnn::_linear_pointwise" in ops.names and "aten::mm" not in ops.names, ops.names
        expected = torch.cat([F.linear(x, m.weight, m.bias) for m in (q, k, v)], dim=-1)  # each its own columns
        assert got.shape == (num_tokens, 960)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_steps_the_kernel_takes_stay_the_kernels_and_bfloat16_stays_torchs():
    linear = _linear(576, 192, torch.float32, False, seed=1)
    library = matvec.load()[0]
    x = torch.randn(library.max_tokens, 576)
    assert torch.equal(gemm.kernel_projection(library, linear)(x), matvec.matvec_projection(library, linear)(x))
    narrow = _linear(576, 192, torch.bfloat16, False, seed=2)
    assert type(gemm.kernel_projection(library, narrow)) is matvec.MatVecLinear
    assert gemm.kernel_projection(None, linear) is None


def test_the_engine_decodes_a_batch_through_onednn_with_the_same_greedy_tokens_as_torchs_matmul(tiny_model_dir):
    # 36 sequences: decode steps past the kernel's max_tokens (32)
    prompts = random_prompts([3, 9, 17, 30, 41, 64, 5, 12, 22, 35, 8, 27, 50, 14, 19, 6, 33, 44, 11, 25] * 2,
                             seed=7)[:36]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engines = [LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=16 << 20, prefix_caching=False,
                                dtype="float32", matvec=setting)) for setting in ("tandem", "torch")]
    for i, prompt in enumerate(prompts):  # long enough that none ends while the others' prompts are prefilled
        engines[0].add_request(f"r{i}", prompt, SamplingParams(max_tokens=64, ignore_eos=True))
    prefilled: set[str] = set()
    while len(prefilled) < len(prompts):  # the prefill (in as many steps as the token budget takes)
        prefilled.update(out.request_id for out in engines[0].step())
    with OpNames() as ops:
        engines[0].step()  # a decode step of 36 tokens
    assert engines[0].num_step_tokens == len(prompts)
    assert "mkldnn::_linear_pointwise" in ops.names and "aten::mm" not in ops.names, ops.names
    while engines[0].has_unfinished():
        engines[0].step()
    assert engines[0].generate(prompts, params) == engines[1].generate(prompts, params)
    assert "oneDNN" in engines[0].matvec["reason"] and "oneDNN" not in engines[1].matvec["reason"]


def test_a_bfloat16_engine_says_nothing_of_onednn(tiny_model_dir):
    eng = LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1 << 20, dtype="bfloat16"))
    assert eng.matvec["kernel"] == "tandem" and "oneDNN" not in eng.matvec["reason"]


def test_on_an_intel_cpu_steps_of_more_tokens_keep_mkls_gemm(monkeypatch):
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(gemm, "onednn_preferred", THE_RULE)
    library = matvec.load()[0]
    linear = _linear(576, 192, torch.float32, False, seed=3)
    projection = gemm.kernel_projection(library, linear)
    assert type(projection) is matvec.MatVecLinear  # the kernel's steps, torch's (MKL's) F.linear above
    x = torch.randn(library.max_tokens + 1, 576)
    assert torch.equal(projection(x), F.linear(x, linear.weight))
    assert "MKL's GEMM (an Intel CPU" in gemm.note(library, torch.float32, "none")
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    assert isinstance(gemm.kernel_projection(library, linear), gemm.GemmMatVecLinear)
