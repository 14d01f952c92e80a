"""Turn the last-position logits of a batch into one token per sequence: greedy, or temperature / top-k / top-p.

Before either, a request's OpenAI logit adjustments are added to its own row (`adjust_logits`): `logit_bias`, then
`presence_penalty` and `frequency_penalty` over the tokens it generated so far. A batch in which no request asks for
them skips that step whole; a request that asks changes only its own row.

A seeded request draws from a generator re-seeded from (seed, number of tokens produced so far) at every step, so
that its tokens depend on nothing else: not on the other sequences of the batch, not on preemption and recompute,
and not on whether its first token was sampled by a prefill worker and the rest by a decode worker.

What a sampled step costs (a large vocabulary, a few rows, one CPU thread; the figures: docs/performance.md, 'Sampling
in the decode step'): torch.multinomial draws one exponential per vocabulary entry (many times the softmax's cost), and
top-k / top-p sorted the whole vocabulary (costlier still). A draw here is one uniform per row against the cumulative
distribution (inverse CDF, about a softmax's cost), and top-k / top-p look at the CANDIDATES best tokens (torch.topk)
whenever those hold the whole nucleus, which they do unless the distribution is flat (then the whole vocabulary is
sorted, as before): the same distribution, a different draw for a given seed than before.
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


# Tokens looked at by top-k / top-p before the whole vocabulary is: enough for the nucleus of a peaked distribution.
CANDIDATES = 256


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        # logits: [B, V] float32, row i belongs to seqs[i]
        if any(seq.params.adjusts_logits for seq in seqs):
            logits = adjust_logits(logits, seqs)
        sampled = [i for i, seq in enumerate(seqs) if not seq.params.is_greedy]
        token_ids = (logits.argmax(dim=-1) if len(sampled) < len(seqs)  # [B]
                     else torch.empty(len(seqs), dtype=torch.long, device=logits.device))
        # Rows with and without top-k / top-p apart: a filtered row's candidates are its best tokens only.
        for rows in ([i for i in sampled if not _filters(seqs[i])], [i for i in sampled if _filters(seqs[i])]):
            if rows:
                token_ids[torch.tensor(rows, device=logits.device)] = self._sample(logits, [seqs[i] for i in rows],
                                                                                   rows)
        return token_ids.tolist()

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> torch.Tensor:
        """One token id per row of `rows` (logits' rows of `seqs`), drawn from its filtered distribution."""
        row_index = torch.tensor(rows, device=logits.device)
        probs, order = self._filtered_probs(logits.index_select(0, row_index), seqs)  # [S, W], [S, W] | None
        uniforms = torch.empty(len(seqs), device=logits.device)  # [S]
        unseeded = [j for j, seq in enumerate(seqs) if seq.params.seed is None]
        if unseeded:
            uniforms[torch.tensor(unseeded, device=logits.device)] = torch.rand(len(unseeded), device=logits.device)
        for j, seq in enumerate(seqs):
            if seq.params.seed is not None:
                self.generator.manual_seed(step_seed(seq.params.seed, seq.num_completion_tokens))
                uniforms[j] = torch.rand(1, generator=self.generator, device=logits.device)[0]
        choice = draw(probs, uniforms).unsqueeze(1)  # [S, 1]
        if order is not None:
            choice = order.gather(1, choice)  # back from ranks to token ids
        return choice.squeeze(1)

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Probabilities after temperature, then top-k, then top-p (the order Hugging Face's warpers apply).

        Returns (probs, order): when a filter applies, probs[i, r] is the probability of the token ranked r (by
        descending logit) and order[i, r] that token's id, over the best W tokens, W = CANDIDATES (or the largest
        top_k) when every row's nucleus lies within them, else the whole vocabulary; tokens past W have probability
        0. Otherwise probs are over token ids and order is None.
        """
        # logits: [S, V]
        num_rows, vocab_size = logits.shape
        temperature = torch.tensor([seq.params.temperature for seq in seqs], device=logits.device)  # [S]
        logits = logits / temperature.unsqueeze(1).to(logits.dtype)
        if not any(_filters(seq) for seq in seqs):
            return torch.softmax(logits, dim=-1), None
        top_k = torch.tensor([seq.params.top_k or vocab_size for seq in seqs], device=logits.device)  # [S]
        top_p = torch.tensor([seq.params.top_p for seq in seqs], device=logits.device, dtype=logits.dtype)  # [S]
        width = min(vocab_size, max([CANDIDATES] + [seq.params.top_k for seq in seqs]))
        probs, order = _nucleus(logits, top_k, top_p, width)
        if probs is None:  # some row's nucleus reaches past the candidates: rank the whole vocabulary
            probs, order = _nucleus(logits, top_k, top_p, vocab_size)
        return probs, order


def _filters(seq: Sequence) -> bool:
    return seq.params.top_k > 0 or seq.params.top_p < 1.0


def _nucleus(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, width: int
             ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(probs, order) over the best `width` tokens after top-k and top-p, or (None, order) when some row's tokens
    past `width` would keep probability (its nucleus is wider)."""
    # logits: [S, V] (tempered); top_k: [S] (V where off); top_p: [S]
    vocab_size = logits.shape[1]
    best, order = logits.topk(width, dim=-1)  # [S, W] each, by descending logit
    ranks = torch.arange(width, device=logits.device)  # [W]
    best = best.masked_fill(ranks.unsqueeze(0) >= top_k.unsqueeze(1), float("-inf"))
    # Normalized as softmax over the row after top-k: over the k kept tokens where top-k cuts, else over all V.
    cut = top_k < vocab_size  # [S]
    norm = torch.logsumexp(best, dim=-1)  # [S]
    if not bool(cut.all()):  # a pass over the whole row only for the rows top-k does not cut
        norm = torch.where(cut, norm, torch.logsumexp(logits, dim=-1))
    probs = torch.exp(best - norm.unsqueeze(1))  # [S, W]
    # Drop a token when the tokens ranked above it already hold top_p of the mass; the first always stays. Every
    # token past W is dropped iff the W best hold more than top_p (or top-k cut within W).
    if width < vocab_size and not bool((cut | (probs.sum(dim=-1) > top_p)).all()):
        return None, order
    mass_before = probs.cumsum(dim=-1) - probs  # [S, W]
    probs = probs.masked_fill(mass_before > top_p.unsqueeze(1), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), order


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the index whose cumulative probability first exceeds uniform x total (inverse CDF): one uniform per
    row instead of multinomial's one exponential per entry. Never an entry of probability 0."""
    # probs: [S, W] (not necessarily normalized); uniforms: [S] in [0, 1). In float32 (a float64 cumsum over a
    # vocabulary takes several times as long): a token's share of the cdf is off by at most one ulp of it, ~6e-8.
    cdf = probs.float().cumsum(dim=-1)  # [S, W], non-decreasing
    total = cdf[:, -1:].contiguous()  # [S, 1]
    index = torch.searchsorted(cdf, uniforms.float().unsqueeze(1) * total, right=True)  # [S, 1]: first cdf > u x total
    last = torch.searchsorted(cdf, total, right=False)  # [S, 1]: where the cdf reaches its total (a nonzero entry)
    return torch.minimum(index, last).squeeze(1)


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
