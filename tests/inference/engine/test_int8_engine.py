"""An int8 engine on a CPU runs Tandem's int8 kernel where `matvec="tandem"` asks for it and by default (`auto`) on a
decode worker or a CPU without VNNI, fbgemm with `torch`, and by default on a prefill or colocated worker with VNNI
both (the kernel for short steps, fbgemm for long ones): it decodes greedily exactly as Hugging Face's own `generate` does on the same
quantized model, a prompt gets the same tokens alone or in a batch, its weights take a quarter of float32's, and on
SmolLM2 its next-token distributions lie closer to the float32 model's than fbgemm's do."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams, quantization
from inference.engine.kernels import int8_linear
from inference.engine.kernels.int8_linear import GEMM_TOKENS, MatVecInt8Linear, SplitInt8Linear
from inference.engine.quantization import (FbgemmInt8Linear, default_kernel, kernel_note, quantize_model,
                                          weight_bytes)
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import hf_greedy, random_prompts, save_random_model

SMOLLM2 = MODELS_DIR / "smollm2-135m"
NUM_NEW_TOKENS = 16

pytestmark = pytest.mark.skipif(int8_linear.load()[0] is None, reason="the int8 kernel cannot run here")


def _engine(model_dir, **settings) -> LLMEngine:
    settings = {"threads": 1, "dtype": "float32", "quantization": "int8", "kv_cache_bytes": 16 << 20,
                "matvec": "tandem", **settings}
    return LLMEngine(Config(model=model_dir, **settings))


def _quantized_hf(model_dir, kernel: str, dtype=torch.float32):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    quantize_model(model, kernel=kernel)
    return model


AVX2_ONLY = frozenset({"avx", "avx2", "fma"})
WITH_VNNI = AVX2_ONLY | {"avx512f", "avx512_vnni"}


def test_the_kernel_follows_the_matvec_setting_the_role_and_the_cpus_int8_dot_product_and_falls_back_to_fbgemm(
        monkeypatch):
    """auto: Tandem's kernel on a decode worker (its steps are few tokens) and on any worker of a CPU without VNNI
    (fbgemm's 16-bit pair sums and _int_mm crawl there), on prefill and colocated workers with VNNI the kernel for
    short steps and fbgemm's int8 GEMM (it prefills faster) for long ones; tandem and torch as asked; fbgemm wherever
    the kernel cannot run."""
    cpu = torch.device("cpu")
    kernels = {(flags, role): [default_kernel(cpu, setting, flags, role) for setting in ("auto", "tandem", "torch")]
               for flags in (AVX2_ONLY, WITH_VNNI) for role in ("prefill", "decode", "colocated")}
    assert kernels == {(AVX2_ONLY, "prefill"): ["matvec", "matvec", "fbgemm"],
                       (AVX2_ONLY, "decode"): ["matvec", "matvec", "fbgemm"],
                       (AVX2_ONLY, "colocated"): ["matvec", "matvec", "fbgemm"],
                       (WITH_VNNI, "prefill"): ["split", "matvec", "fbgemm"],
                       (WITH_VNNI, "decode"): ["matvec", "matvec", "fbgemm"],
                       (WITH_VNNI, "colocated"): ["split", "matvec", "fbgemm"]}
    assert default_kernel(torch.device("cuda"), "tandem") == "weight_only"
    assert kernel_note("matvec", "auto", AVX2_ONLY) == "Tandem's int8 kernel: no int8 dot product (VNNI) on this CPU"
    assert kernel_note("matvec", "auto", WITH_VNNI, "decode") == \
        "Tandem's int8 kernel: a decode worker's steps are a few tokens"
    assert kernel_note("split", "auto", WITH_VNNI, "prefill") == ("Tandem's int8 kernel for short steps, fbgemm's "
                                                                  "int8 GEMM for long ones: this CPU has avx512_vnni, "
                                                                  "whose int8 GEMM prefills faster")
    assert kernel_note("fbgemm", "torch", WITH_VNNI) == "fbgemm's dynamic int8 linear"
    monkeypatch.setattr(int8_linear, "load", lambda: (None, "no C compiler"))
    assert [default_kernel(cpu, setting, flags, "colocated") for setting in ("auto", "tandem")
            for flags in (AVX2_ONLY, WITH_VNNI)] == ["fbgemm"] * 4


def test_every_int8_linear_of_the_engine_is_the_kernels_where_matvec_is_tandem(tiny_model_dir, monkeypatch):
    runner = _engine(tiny_model_dir).model_runner
    attn, mlp = runner.model.model.layers[0].self_attn, runner.model.model.layers[0].mlp
    for module in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj, runner.model.lm_head):
        assert isinstance(module, MatVecInt8Linear)
    assert "Tandem's int8 kernel" in _engine(tiny_model_dir).matvec["reason"]
    monkeypatch.setattr(quantization, "cpu_flags", lambda: WITH_VNNI)  # auto on a CPU with VNNI: both
    engine = _engine(tiny_model_dir, matvec="auto")
    o_proj = engine.model_runner.model.model.layers[0].self_attn.o_proj
    assert isinstance(o_proj, SplitInt8Linear) and isinstance(o_proj.gemm, FbgemmInt8Linear)
    assert "for short steps, fbgemm's int8 GEMM for long ones" in engine.matvec["reason"]
    engine = _engine(tiny_model_dir, matvec="torch")
    assert isinstance(engine.model_runner.model.model.layers[0].self_attn.o_proj, FbgemmInt8Linear)
    assert "fbgemm's dynamic int8 linear" in engine.matvec["reason"]
    engine = _engine(tiny_model_dir, matvec="auto", role="decode")  # but a decode worker's: the kernel
    assert isinstance(engine.model_runner.model.model.layers[0].self_attn.o_proj, MatVecInt8Linear)
    assert "a decode worker's steps are a few tokens" in engine.matvec["reason"]
    monkeypatch.setattr(quantization, "cpu_flags", lambda: AVX2_ONLY)  # and without: the kernel, saying why
    engine = _engine(tiny_model_dir, matvec="auto")
    assert isinstance(engine.model_runner.model.model.layers[0].self_attn.o_proj, MatVecInt8Linear)
    assert "no int8 dot product (VNNI) on this CPU" in engine.matvec["reason"]


def test_the_engine_matches_hugging_face_generate_on_the_same_quantized_model(tiny_model_dir):
    """Prompts of up to 200 tokens: prefills through the kernel and through the dequantized GEMM (GEMM_TOKENS)."""
    engine = _engine(tiny_model_dir)
    prompts = random_prompts([3, 7, 15, 16, 17, 33, 90, 200])
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS))
    hf = _quantized_hf(tiny_model_dir, "matvec")
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(hf, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)} tokens"


def test_split_runs_the_kernel_for_short_steps_and_fbgemm_for_long_ones_and_decodes_as_hugging_face(
        tiny_model_dir, monkeypatch):
    """A prefilling worker of a CPU with VNNI: a decode step's few tokens through the kernel, a prompt of GEMM_TOKENS
    tokens or more through fbgemm's int8 GEMM; the engine's greedy tokens are Hugging Face's on the same model."""
    monkeypatch.setattr(quantization, "cpu_flags", lambda: WITH_VNNI)
    engine = _engine(tiny_model_dir, matvec="auto", role="colocated")
    assert engine.model_runner.int8_kernel == "split"
    hf = _quantized_hf(tiny_model_dir, "split")
    linear = hf.model.layers[0].mlp.gate_up_proj
    short, long = torch.randn(4, linear.in_features), torch.randn(GEMM_TOKENS, linear.in_features)
    assert torch.equal(linear(short), linear.kernel(short)) and torch.equal(linear(long), linear.gemm(long))
    assert not torch.equal(linear(short), linear.gemm(short))  # two kernels, two roundings: the routing shows
    # Each prompt alone: in a batch, a long prompt's chunks beside the others' decodes are short steps (the
    # kernel's), where Hugging Face's one pass is fbgemm's: two roundings, and greedy tokens may part after a near-tie.
    for prompt in random_prompts([3, 17, 90, 200], seed=5):
        output = engine.generate([prompt], SamplingParams(max_tokens=NUM_NEW_TOKENS))[0]
        assert output == hf_greedy(hf, prompt, NUM_NEW_TOKENS), f"prompt of {len(prompt)} tokens"
    assert engine.weight_bytes <= 0.55 * LLMEngine(Config(model=tiny_model_dir, threads=1, dtype="float32",
                                                          kv_cache_bytes=4 << 20)).weight_bytes


def test_a_prompt_gets_the_same_tokens_alone_as_in_a_batch(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    prompts = random_prompts([3, 7, 15, 16, 17, 33, 90, 200], seed=4)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    batched = engine.generate(prompts, params)
    assert batched == [engine.generate([prompt], params)[0] for prompt in prompts]


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_qwen2_with_biased_qkv_and_mistral_match_hugging_face_on_the_same_quantized_model(tiny_model_dir, tmp_path,
                                                                                      config_cls, model_cls):
    save_random_model(config_cls, model_cls, tmp_path, tiny_model_dir)
    engine = _engine(tmp_path, kv_cache_bytes=1 << 20)
    prompts = random_prompts([5, 21, 40], seed=1)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    reference = _quantized_hf(tmp_path, "matvec")
    if config_cls is Qwen2Config:
        assert reference.model.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0
    for prompt, output in zip(prompts, outputs):
        mask = torch.ones(1, len(prompt), dtype=torch.long)
        expected = reference.generate(torch.tensor([prompt]), attention_mask=mask, do_sample=False, max_new_tokens=10,
                                      min_new_tokens=10)[0, len(prompt):]
        assert output == expected.tolist(), f"prompt of {len(prompt)} tokens"


def test_int8_weights_run_under_bfloat16_activations_and_kv(tiny_model_dir):
    """bfloat16 inputs of short steps take the kernel on a float32 copy (it reads float32), long ones the dequantized
    GEMM in float32; the engine generates."""
    engine = LLMEngine(Config(model=tiny_model_dir, threads=1, dtype="bfloat16", quantization="int8",
                              kv_cache_bytes=4 << 20, matvec="tandem"))
    o_proj = engine.model_runner.model.model.layers[0].self_attn.o_proj
    assert isinstance(o_proj, MatVecInt8Linear)
    short = torch.randn(3, o_proj.in_features, dtype=torch.bfloat16)
    assert torch.equal(o_proj(short), o_proj.kernel(short.float()).to(torch.bfloat16))
    outputs = engine.generate(random_prompts([9, 30], seed=6), SamplingParams(max_tokens=6, ignore_eos=True))
    assert [len(o) for o in outputs] == [6, 6]


def test_the_engines_int8_weights_take_about_a_quarter_of_float32s(tiny_model_dir):
    plain = LLMEngine(Config(model=tiny_model_dir, threads=1, dtype="float32", kv_cache_bytes=4 << 20))
    int8, fbgemm = _engine(tiny_model_dir), _engine(tiny_model_dir, matvec="torch")
    assert int8.weight_bytes <= 0.27 * plain.weight_bytes  # int8 plus a float32 scale per row, norms in float32
    assert int8.weight_bytes <= fbgemm.weight_bytes


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason="SmolLM2 is not prepared")
def test_smollm2_holds_its_tied_matrix_once_and_lies_closer_to_float32_than_fbgemm():
    """Mean KL of the next-token distributions from the float32 model's over a text (teacher-forced): the kernel
    (int16 activations) 0.0036-0.0046, fbgemm (8-bit activations after SmoothQuant) 0.019 on an Intel Xeon with VNNI,
    0.12 on an AMD EPYC without (7-bit activations there)."""
    torch.set_num_threads(1)
    reference = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    float_bytes = weight_bytes(reference)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, 12), generator=g)
    with torch.inference_mode():
        ids = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=60)
        expected = reference(ids).logits[0].log_softmax(-1)  # [S, V]
    del reference
    kl = {}
    for kernel in ("matvec", "fbgemm"):
        model = _quantized_hf(SMOLLM2, kernel)
        if kernel == "matvec":
            assert model.lm_head.weight_int8.data_ptr() == model.model.embed_tokens.matrix.weight_int8.data_ptr()
            assert weight_bytes(model) <= 0.27 * float_bytes
        with torch.inference_mode():
            got = model(ids).logits[0].log_softmax(-1)
        kl[kernel] = (expected.exp() * (expected - got)).sum(-1).mean().item()
    assert kl["matvec"] <= 0.5 * kl["fbgemm"], kl


def test_a_compiled_decode_step_runs_the_kernel_between_its_graphs_with_the_same_tokens(tiny_model_dir):
    compiled = _engine(tiny_model_dir, kv_cache_bytes=4 << 20, compile=True)
    if not compiled.model_runner.compile_info["enabled"]:
        pytest.skip(compiled.model_runner.compile_info["fallback"])
    prompts, params = random_prompts([5, 20], seed=2), SamplingParams(max_tokens=8, ignore_eos=True)
    eager = _engine(tiny_model_dir, kv_cache_bytes=4 << 20)
    assert compiled.generate(prompts, params) == eager.generate(prompts, params)
