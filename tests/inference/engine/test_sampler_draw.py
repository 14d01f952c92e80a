"""The sampler's draw and filters against their definitions: top-k / top-p over the best candidates give the
distribution of the whole vocabulary sorted (HF's warpers' order), a flat distribution falls back to the whole
sort, and the inverse-CDF draw follows the probabilities and never picks a token of probability 0."""
from __future__ import annotations

import pytest
import torch

from inference.engine.sampler import CANDIDATES, Sampler, draw
from inference.engine.sequence import SamplingParams, Sequence

VOCAB = 4096


def hot(**settings) -> SamplingParams:
    """Sampled (not greedy: SamplingParams' temperature defaults to 0), at temperature 1 unless said."""
    return SamplingParams(**{"temperature": 1.0, **settings})


def seqs_for(*params: SamplingParams) -> list[Sequence]:
    return [Sequence(f"r{i}", [1, 2, 3], p) for i, p in enumerate(params)]


def reference(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, top-k, top-p over the whole vocabulary sorted, as probabilities over token ids: [S, V]."""
    out = torch.zeros_like(logits)
    for i, seq in enumerate(seqs):
        row = logits[i] / seq.params.temperature
        values, order = row.sort(descending=True)
        if seq.params.top_k:
            values[seq.params.top_k:] = float("-inf")
        probs = torch.softmax(values, dim=-1)
        probs[(probs.cumsum(0) - probs) > seq.params.top_p] = 0.0
        out[i, order] = probs / probs.sum()
    return out


def dense(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    probs, order = Sampler._filtered_probs(logits, seqs)
    return probs if order is None else torch.zeros_like(logits).scatter_(1, order, probs)


def test_the_candidates_give_the_distribution_of_the_whole_sort():
    gen = torch.Generator().manual_seed(0)
    peaked = torch.randn(4, VOCAB, generator=gen) * 4  # a nucleus of a few dozen tokens
    seqs = seqs_for(hot(temperature=0.7, top_p=0.9), hot(top_k=50), hot(temperature=1.3, top_k=40, top_p=0.8),
                    hot(top_k=CANDIDATES + 300))
    probs, order = Sampler._filtered_probs(peaked, seqs)
    assert probs.shape[1] == CANDIDATES + 300 < VOCAB  # the widest top-k, not the vocabulary
    torch.testing.assert_close(dense(peaked, seqs), reference(peaked, seqs), atol=1e-6, rtol=1e-5)


def test_a_flat_distribution_ranks_the_whole_vocabulary():
    flat = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1)) * 0.1  # top_p 0.95 needs ~3,900 tokens
    seqs = seqs_for(hot(top_p=0.95), hot(top_k=10))
    probs, _ = Sampler._filtered_probs(flat, seqs)
    assert probs.shape[1] == VOCAB
    kept = (dense(flat, seqs) > 0).sum(dim=1)
    assert kept[0] > CANDIDATES and kept[1] == 10
    torch.testing.assert_close(dense(flat, seqs), reference(flat, seqs), atol=1e-6, rtol=1e-5)


def test_the_draw_follows_the_probabilities():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0]]).expand(20_000, 5)
    uniforms = torch.rand(20_000, generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(draw(probs, uniforms), minlength=5) / 20_000
    assert counts[1] == counts[4] == 0
    torch.testing.assert_close(counts, torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0]), atol=0.015, rtol=0)


@pytest.mark.parametrize("uniform", [0.0, 0.5, 1.0 - 2 ** -24])
def test_no_uniform_draws_a_token_of_probability_zero(uniform):
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0, 0.0]])
    picked = int(draw(probs, torch.tensor([uniform])))
    assert probs[0, picked] > 0


def test_rows_with_and_without_filters_sample_in_one_batch():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3)) * 4
    seqs = seqs_for(hot(seed=1), hot(top_k=1), hot(seed=2, top_p=0.5))
    tokens = Sampler(torch.device("cpu"))(logits, seqs)
    assert tokens[1] == int(logits[1].argmax())  # top_k 1 is greedy
    assert reference(logits[2:], seqs[2:])[0, tokens[2]] > 0  # inside the top-p nucleus
    assert Sampler(torch.device("cpu"))(logits, seqs)[::2] == tokens[::2]  # seeded rows reproduce
