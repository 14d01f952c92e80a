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
