"""Config.weight_layout: with torch's matmul (matvec=torch), "auto" stores a float32 CPU model's linear weights
transposed (fused q/k/v and gate/up) where they are converted from the file's dtype (a float32 file's mapped weights
stay shared as loaded), which changes summation order but not greedy tokens; bfloat16 and INT8 keep the weights as
loaded; "as_loaded" is the old path; with Tandem's matvec kernel (auto's pick where it runs) auto keeps them as
loaded, which the kernel reads fastest. Beside it, the engine counts one decode step's tensor ops once (a worker puts
them on /info)."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.config import ConfigError
from tests.conftest import MODELS_DIR
from tests.inference.engine.support import random_prompts, save_random_model

GREEDY = SamplingParams(max_tokens=64, ignore_eos=True)
SMOLLM2 = MODELS_DIR / "smollm2-135m"
SMOLLM2_TEXTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
                 "List three prime numbers:"]


def engine(model_dir, **settings) -> LLMEngine:
    return LLMEngine(Config(model=model_dir, threads=1, kv_cache_bytes=8 << 20, prefix_caching=False,
                            **{"dtype": "float32", "matvec": "torch", **settings}))


def _bfloat16_copy(model_dir, to) -> None:
    """The model folder with its weights stored in bfloat16."""
    shutil.copytree(model_dir, to)
    weights = load_file(to / "model.safetensors")
    save_file({name: t.to(torch.bfloat16) for name, t in weights.items()}, to / "model.safetensors",
              metadata={"format": "pt"})


def test_auto_transposes_float32_converted_on_a_cpu_and_keeps_shared_bfloat16_and_int8_as_loaded(tiny_model_dir,
                                                                                                  tmp_path):
    _bfloat16_copy(tiny_model_dir, tmp_path / "bf16")
    layouts = {name: engine(model, **settings).weight_layout
               for name, (model, settings) in {
                   "float32 from bfloat16": (tmp_path / "bf16", {}),
                   "float32 from float32": (tiny_model_dir, {}),
                   "bfloat16": (tmp_path / "bf16", {"dtype": "bfloat16"}),
                   "int8": (tmp_path / "bf16", {"quantization": "int8"}),
                   "asked": (tmp_path / "bf16", {"weight_layout": "as_loaded"}),
                   "matvec kernel": (tmp_path / "bf16", {"matvec": "tandem"})}.items()}
    assert {name: layout["layout"] for name, layout in layouts.items()} == {
        "float32 from bfloat16": "transposed", "float32 from float32": "as_loaded", "bfloat16": "as_loaded",
        "int8": "as_loaded", "asked": "as_loaded", "matvec kernel": "as_loaded"}
    assert "matvec kernel streams the weights as loaded" in layouts["matvec kernel"]["reason"]
    assert layouts["float32 from bfloat16"]["setting"] == "auto"
    assert "float32 on a CPU" in layouts["float32 from bfloat16"]["reason"]
    # The float32 file's weights are mapped and shared between the host's workers: a copy each would cost RAM.
    assert "shared by every worker" in layouts["float32 from float32"]["reason"]
    assert "int8" in layouts["int8"]["reason"]


def test_the_transposed_weights_are_fused_and_held_once_in_in_out_order(tiny_model_dir):
    runner = engine(tiny_model_dir, weight_layout="transposed").model_runner
    layer = runner.model.model.layers[0]
    assert hasattr(layer.self_attn, "qkv_proj") and hasattr(layer.mlp, "gate_up_proj")
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj,
                   runner.model.lm_head):
        assert linear.weight.t().is_contiguous() and linear.weight.shape == (linear.out_features,
                                                                             linear.in_features)


def test_float32_greedy_tokens_are_identical_with_the_weights_transposed_or_as_loaded(tiny_model_dir):
    prompts = random_prompts([3, 11, 29, 47, 80, 128], seed=12)
    transposed = engine(tiny_model_dir, weight_layout="transposed")
    as_loaded = engine(tiny_model_dir, weight_layout="as_loaded")
    assert transposed.weight_layout["layout"] == "transposed"
    assert transposed.generate(prompts, GREEDY) == as_loaded.generate(prompts, GREEDY)


def test_a_tied_embedding_reads_its_rows_from_the_transposed_lm_head(tiny_model_dir, tmp_path):
    save_random_model(functools.partial(LlamaConfig, tie_word_embeddings=True), LlamaForCausalLM, tmp_path,
                      tiny_model_dir)
    transposed = engine(tmp_path, weight_layout="transposed")
    as_loaded = engine(tmp_path, weight_layout="as_loaded")
    model = transposed.model_runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # one matrix, not a copy per use
    ids = torch.tensor([0, 5, 77])
    assert torch.equal(model.model.embed_tokens(ids), as_loaded.model_runner.model.model.embed_tokens(ids))
    prompts = random_prompts([7, 33, 60], seed=4)
    assert transposed.generate(prompts, GREEDY) == as_loaded.generate(prompts, GREEDY)


@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(),
                    reason=f"SmolLM2 is not prepared at {SMOLLM2} (python -m inference.models prepare smollm2)")
def test_smollm2_float32_greedy_tokens_are_identical_transposed_as_loaded_and_through_the_matvec_kernel():
    settings = {"model": SMOLLM2, "threads": 1, "dtype": "float32", "kv_cache_bytes": 32 << 20}
    transposed = LLMEngine(Config(**settings, matvec="torch"))
    as_loaded = LLMEngine(Config(**settings, matvec="torch", weight_layout="as_loaded"))
    kernel = LLMEngine(Config(**settings))  # auto: Tandem's kernel over the weights as loaded
    assert transposed.weight_layout["layout"] == "transposed"
    assert kernel.matvec["kernel"] == "tandem" and kernel.weight_layout["layout"] == "as_loaded"
    prompts = [transposed.tokenizer.encode(text) for text in SMOLLM2_TEXTS]
    expected = transposed.generate(prompts, GREEDY)
    assert as_loaded.generate(prompts, GREEDY) == expected
    assert kernel.generate(prompts, GREEDY) == expected


def test_an_unknown_weight_layout_is_refused_naming_the_choices(tiny_model_dir):
    with pytest.raises(ConfigError, match="weight_layout must be one of auto, as_loaded, transposed"):
        Config(model=tiny_model_dir, weight_layout="columns")


def test_the_engine_counts_a_decode_steps_tensor_ops_and_a_prefill_engine_none(tiny_model_dir):
    lean, reference = engine(tiny_model_dir), engine(tiny_model_dir, lean_decode=False)
    assert 0 < lean.decode_step_ops < reference.decode_step_ops
    assert engine(tiny_model_dir, role="prefill").decode_step_ops is None
    # Counting ran a step in block 0: it leaves the pool as it found it.
    assert not lean.model_runner.k_cache.any() and not lean.model_runner.v_cache.any()
