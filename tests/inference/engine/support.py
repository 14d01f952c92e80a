"""What the engine tests hold the engine to: Hugging Face's own greedy `generate` on the same tiny model."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
import torch


@contextlib.contextmanager
def capped_isa(library, isa: str):
    """A kernel library (its `isa`, `cap_isa`) capped at `isa` inside the block, restored after; the test is skipped
    where the CPU has not got that set (the AVX2 kernels run on an AVX-512 CPU too)."""
    widest = library.isa
    if library.cap_isa(isa) != isa:
        library.cap_isa(widest)
        pytest.skip(f"this CPU has no {isa}")
    try:
        yield isa
    finally:
        library.cap_isa(widest)


def random_prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]


def prefilled(eng, prompts: list[list[int]]):
    """The engine after its prefill steps: every prompt running, the next step a decode step; its running sequences."""
    from inference.engine import SamplingParams

    for i, prompt in enumerate(prompts):
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    while eng.scheduler.waiting or any(seq.is_prefilling for seq in eng.scheduler.running):
        eng.step()
    return list(eng.scheduler.running)


def hf_greedy(model, prompt, num_new_tokens):
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=num_new_tokens)
    return out[0, len(prompt):].tolist()


def teacher_forced_shortfall(model, prompt, tokens) -> list[float]:
    """How far below the model's top logit each of `tokens` lies, the model fed the prompt and those tokens at once
    (teacher forcing): 0 where a token is the model's own greedy pick given the same prefix."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()  # [n, V]
    chosen = logits.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)  # [n]
    return (logits.max(dim=1).values - chosen).tolist()


def stepwise_shortfall(model, prompt, tokens) -> list[float]:
    """As teacher_forced_shortfall, but with the engine's call shapes: the prompt in one forward, then each token in
    a forward of its own over the model's cache. Where a kernel's rounding depends on the call (fbgemm's INT8
    quantizes each call's activations with that call's own scale), this reference rounds as the engine does."""
    shortfalls = []
    with torch.inference_mode():
        out = model(torch.tensor([prompt]), use_cache=True)
        for i, token in enumerate(tokens):
            logits = out.logits[0, -1].float()  # [V]
            shortfalls.append((logits.max() - logits[token]).item())
            if i + 1 < len(tokens):
                out = model(torch.tensor([[token]]), cache=out.cache, use_cache=True)
    return shortfalls


# A small random Llama-like model (Qwen2, Mistral) for the architecture tests, with the tiny model's tokenizer.
SMALL = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, initializer_range=0.3)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_random_model(config_cls, model_cls, path: Path, tokenizer_dir: Path):
    """Save a seeded random `model_cls` of SMALL's shape at `path`; Qwen2's q/k/v biases drawn so that they matter
    (random init leaves them at zero)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(config_cls(**SMALL)).eval()
        if model.model.layers[0].self_attn.q_proj.bias is not None:
            with torch.no_grad():
                for layer in model.model.layers:
                    for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        projection.bias.normal_(0, 0.5)
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, path / name)
