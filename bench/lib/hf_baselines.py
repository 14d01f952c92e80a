"""The baselines the engine is measured against, all plain Hugging Face transformers on the same model.

- static_batch_generate: the upper limit for a batch that starts and ends together: left-padded prompts, one
  forward pass per step for the whole batch, a DynamicCache. No scheduling, no paging, nothing to join or leave.
- hf_generate_one_by_one: `model.generate` per request, what a naive server does.
- hf_generate_batch: transformers' own continuous batching (`model.generate_batch`, paged attention), used as its
  docs show: each call builds a manager (paged cache, background thread) and tears it down. On CPU that setup is
  most of the cold figure.
- hf_generate_batch with persistent=True: the manager is built once (by a warm-up call sized for the largest batch)
  and reused, what a long-running server would do; the fairer comparison for steady-state decode speed.
All are greedy and never stop early (the ignore_eos of the engine's SamplingParams), so token counts are equal.
"""
from __future__ import annotations

import inspect
import logging

import torch


def load_hf_model(path, device: str, dtype: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    return model


def pad_token_id(model) -> int:
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.config.pad_token_id
    return 0 if pad is None else int(pad if isinstance(pad, int) else pad[0])


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed forward(past_key_values=) to forward(cache=) and warns on the old name.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def static_batch_generate(model, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
    """Greedy decode of all prompts as one static batch; returns the new token ids of each prompt."""
    from transformers import DynamicCache

    device = model.device
    batch, max_len = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((batch, max_len), pad_token_id(model), dtype=torch.long)  # [B, S]
    attention_mask = torch.zeros((batch, max_len), dtype=torch.long)  # [B, S]
    for i, prompt in enumerate(prompts):
        input_ids[i, max_len - len(prompt):] = torch.tensor(prompt)
        attention_mask[i, max_len - len(prompt):] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    # Left padding shifts each prompt right; positions must still start at 0 on its first real token.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, S]
    cache = DynamicCache(config=model.config)
    cache_kw = _cache_kwarg(model)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    next_ids = out.logits[:, -1].argmax(-1)  # [B]
    generated = [next_ids]
    ones = torch.ones((batch, 1), dtype=attention_mask.dtype, device=device)
    for _ in range(num_new_tokens - 1):
        attention_mask = torch.cat([attention_mask, ones], dim=1)  # [B, S + t]
        position_ids = position_ids[:, -1:] + 1  # [B, 1]
        out = model(input_ids=next_ids[:, None], attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=True, logits_to_keep=1, **{cache_kw: cache})
        next_ids = out.logits[:, -1].argmax(-1)  # [B]
        generated.append(next_ids)
    return torch.stack(generated, dim=1).tolist()  # [B, num_new_tokens]


@torch.inference_mode()
def hf_generate_one_by_one(model, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
    results = []
    for prompt in prompts:
        input_ids = torch.tensor([prompt], device=model.device)  # [1, S]
        # min_new_tokens suppresses EOS until the end: the same token count as the engine's ignore_eos.
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=num_new_tokens, min_new_tokens=num_new_tokens, do_sample=False,
                             pad_token_id=pad_token_id(model))
        results.append(out[0, len(prompt):].tolist())
    return results


def hf_generate_batch(model, prompts: list[list[int]], num_new_tokens: int, persistent: bool = False,
                      ) -> list[list[int]]:
    from transformers import GenerationConfig

    # eos_token_id=None: transformers' continuous batching then disables EOS (ignore_eos) and logs a warning per call,
    # which is expected here and silenced.
    config = GenerationConfig(max_new_tokens=num_new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=pad_token_id(model))
    logger = logging.getLogger("ContinuousBatchingLogger")
    level = logger.level
    logger.setLevel(logging.ERROR)  # also silences the per-call warning about persistent managers
    try:
        outputs = model.generate_batch(inputs=prompts, generation_config=config, persistent_manager=persistent)
    finally:
        logger.setLevel(level)
    results = [list(o.generated_tokens) for o in outputs.values()]
    if len(results) != len(prompts) or any(len(r) != num_new_tokens for r in results):
        raise RuntimeError(f"generate_batch returned {[len(r) for r in results]} tokens for {len(prompts)} prompts")
    return results
