"""Turn the last-position logits of a batch into one token per sequence: greedy, or temperature / top-k / top-p.

Before either, a request's OpenAI logit adjustments are added to its own row (`adjust_logits`): `logit_bias`, then
`presence_penalty` and `frequency_penalty` over the tokens it generated so far. A batch in which no request asks for
them skips that step whole; a request that asks changes only its own row.

A seeded request draws from a generator re-seeded from (seed, number of tokens produced so far) at every step, so
that its tokens depend on nothing else: not on the other sequences of the batch, not on preemption and recompute,
and not on whether its first token was sampled by a prefill worker and the rest by a decode worker.
"""
from __future__ import annotations

import torch

from inference.engine.sequence import Sequence

_MASK64 = (1 << 64) - 1


def step_seed(seed: int, step: int) -> int:
    """A well-mixed 63-bit seed for the `step`-th draw of a request seeded with `seed` (splitmix64)."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        # logits: [B, V] float32, row i belongs to seqs[i]
        if any(seq.params.adjusts_logits for seq in seqs):
            logits = adjust_logits(logits, seqs)
        token_ids = logits.argmax(dim=-1)  # [B]
        rows = [i for i, seq in enumerate(seqs) if not seq.params.is_greedy]
        if not rows:
            return token_ids.tolist()
        sampled_seqs = [seqs[i] for i in rows]
        row_index = torch.tensor(rows, device=logits.device)
        probs, order = self._filtered_probs(logits.index_select(0, row_index), sampled_seqs)  # [S, V], [S, V] | None
        choice = torch.empty(len(rows), 1, dtype=torch.long, device=logits.device)  # [S, 1]
        unseeded = [j for j, seq in enumerate(sampled_seqs) if seq.params.seed is None]
        if unseeded:
            index = torch.tensor(unseeded, device=logits.device)
            choice[index] = torch.multinomial(probs.index_select(0, index), 1)
        for j, seq in enumerate(sampled_seqs):
            if seq.params.seed is not None:
                self.generator.manual_seed(step_seed(seq.params.seed, seq.num_completion_tokens))
                choice[j] = torch.multinomial(probs[j], 1, generator=self.generator)
        if order is not None:
            choice = order.gather(1, choice)  # back from sorted positions to token ids
        token_ids[row_index] = choice.squeeze(1)
        return token_ids.tolist()

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Probabilities after temperature, then top-k, then top-p (the order Hugging Face's warpers apply).

        Returns (probs, order): when a filter applies, probs are over the vocabulary sorted by descending logit and
        order[i, r] is the token id at rank r; otherwise probs are over token ids and order is None.
        """
        # logits: [S, V]
        num_rows, vocab_size = logits.shape
        temperature = torch.tensor([seq.params.temperature for seq in seqs], device=logits.device)  # [S]
        logits = logits / temperature.unsqueeze(1).to(logits.dtype)
        if all(seq.params.top_k == 0 and seq.params.top_p >= 1.0 for seq in seqs):
            return torch.softmax(logits, dim=-1), None
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # [S, V], [S, V]
        top_k = torch.tensor([seq.params.top_k or vocab_size for seq in seqs], device=logits.device)  # [S]
        ranks = torch.arange(vocab_size, device=logits.device)  # [V]
        sorted_logits = sorted_logits.masked_fill(ranks.unsqueeze(0) >= top_k.unsqueeze(1), float("-inf"))
        probs = torch.softmax(sorted_logits, dim=-1)  # [S, V]
        top_p = torch.tensor([seq.params.top_p for seq in seqs], device=logits.device, dtype=probs.dtype)  # [S]
        # Drop a token when the tokens ranked above it already hold top_p of the mass; the first always stays.
        mass_before = probs.cumsum(dim=-1) - probs  # [S, V]
        probs = probs.masked_fill(mass_before > top_p.unsqueeze(1), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs, order


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """A copy of `logits` with each sequence's logit bias and penalties added to its row (OpenAI's definitions).

    1. logit_bias: logits[j] += bias[j] for each token j the request names.
    2. Penalties, over count[j], how many times token j occurs in the request's generated tokens (never its prompt):
       logits[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0).
    Rows of sequences that ask for neither are copied unchanged.
    """
    # logits: [B, V]
    device = logits.device
    logits = logits.clone()
    bias_rows, bias_tokens, biases = [], [], []
    for i, seq in enumerate(seqs):
        for token_id, bias in seq.params.logit_bias:
            bias_rows.append(i)
            bias_tokens.append(token_id)
            biases.append(bias)
    if biases:
        logits.index_put_((torch.tensor(bias_rows, device=device), torch.tensor(bias_tokens, device=device)),
                          torch.tensor(biases, device=device, dtype=logits.dtype), accumulate=True)
    rows = [i for i, seq in enumerate(seqs) if seq.params.presence_penalty or seq.params.frequency_penalty]
    if not rows:
        return logits
    # One flat scatter counts every penalized sequence's generated tokens: (row in counts, token id) per token.
    count_rows, count_tokens = [], []
    for j, i in enumerate(rows):
        output = seqs[i].output_token_ids
        count_rows += [j] * len(output)
        count_tokens += output
    if not count_tokens:  # nothing generated yet (a prefill's first token): nothing to penalize
        return logits
    counts = torch.zeros(len(rows), logits.shape[1], device=device, dtype=logits.dtype)  # [P, V]
    counts.index_put_((torch.tensor(count_rows, device=device), torch.tensor(count_tokens, device=device)),
                      torch.ones(len(count_tokens), device=device, dtype=logits.dtype), accumulate=True)
    frequency = torch.tensor([seqs[i].params.frequency_penalty for i in rows], device=device,
                             dtype=logits.dtype)  # [P]
    presence = torch.tensor([seqs[i].params.presence_penalty for i in rows], device=device, dtype=logits.dtype)  # [P]
    penalty = frequency.unsqueeze(1) * counts + presence.unsqueeze(1) * (counts > 0)  # [P, V]
    logits.index_add_(0, torch.tensor(rows, device=device), -penalty)
    return logits
