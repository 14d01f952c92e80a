"""Beyond Llama: Qwen2 (biased q/k/v projections) and Mistral layers decode exactly as Hugging Face does."""
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference.engine import Config, LLMEngine, SamplingParams

SMALL = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, initializer_range=0.3)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.mark.parametrize("config_cls, model_cls", [(Qwen2Config, Qwen2ForCausalLM),
                                                   (MistralConfig, MistralForCausalLM)])
def test_a_random_model_of_a_llama_like_architecture_matches_hugging_face(tiny_model_dir, tmp_path, config_cls,
                                                                         model_cls):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(config_cls(**SMALL)).eval()
        if config_cls is Qwen2Config:  # random init leaves biases at zero: make them matter
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.k_proj.bias.normal_(0, 0.5)
                    layer.self_attn.q_proj.bias.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir / name, tmp_path / name)
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
