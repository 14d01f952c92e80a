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
