"""Beyond Llama: Qwen2 (biased q/k/v projections) and Mistral layers decode exactly as Hugging Face does."""
import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import save_random_model


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_a_random_model_of_a_llama_like_architecture_matches_hugging_face(tiny_model_dir, tmp_path, config_cls,
                                                                         model_cls):
    save_random_model(config_cls, model_cls, tmp_path, tiny_model_dir)
    engine = LLMEngine(Config(model=tmp_path, threads=1, kv_cache_bytes=1 << 20))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 4096, (n,), generator=g).tolist() for n in (5, 21, 40)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs):
        mask = torch.ones(1, len(prompt), dtype=torch.long)
        expected = reference.generate(torch.tensor([prompt]), attention_mask=mask, do_sample=False, max_new_tokens=10,
                                      min_new_tokens=10)[0, len(prompt):]
        assert output == expected.tolist(), f"prompt of {len(prompt)} tokens"
