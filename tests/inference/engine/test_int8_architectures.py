"""int8 beyond Llama: Qwen2 (biased q/k/v, fused with their biases) and Mistral decode as Hugging Face `generate`
does on the same quantized model, token for token, on fbgemm's kernel (matvec="torch"; test_int8_engine.py has
Tandem's)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from inference.engine.quantization import quantize_model
from tests.inference.engine.support import save_random_model


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_an_int8_llama_like_model_matches_hugging_face_on_the_same_quantized_model(tiny_model_dir, tmp_path,
                                                                                  config_cls, model_cls):
    save_random_model(config_cls, model_cls, tmp_path, tiny_model_dir)
    engine = LLMEngine(Config(model=tmp_path, threads=1, kv_cache_bytes=1 << 20, quantization="int8",
                              matvec="torch"))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 21, 40)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    quantize_model(reference, kernel="fbgemm")
    if config_cls is Qwen2Config:
        assert reference.model.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0
    for prompt, output in zip(prompts, outputs):
        mask = torch.ones(1, len(prompt), dtype=torch.long)
        expected = reference.generate(torch.tensor([prompt]), attention_mask=mask, do_sample=False, max_new_tokens=10,
                                      min_new_tokens=10)[0, len(prompt):]
        assert output == expected.tolist(), f"prompt of {len(prompt)} tokens"
