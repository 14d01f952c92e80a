"""What the engine tests hold the engine to: Hugging Face's own greedy `generate` on the same tiny model."""
from __future__ import annotations

import torch


def random_prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]


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
