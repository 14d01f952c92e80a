"""With sampling, speculation leaves the output distribution unchanged (the rejection rule): a statistical test on the
tiny model in float32.

Setup: a decode engine receives the same prompt's K/V (from a prefill engine) and the same first token t1 for N
requests of max_tokens 4, sampled at temperature 0.8 with top_k 5; its first step drafts 2 tokens per request and
verifies them, so t2 and t3 come from the acceptance rule (a kept draft, a draw from the residual, or the bonus).
The empirical joint distribution of (t2, t3) over the N requests is compared with the model's exact one, computed
here with Hugging Face's forward (float32) and a filtering written out independently of the sampler's, by Pearson's
chi-square test: cells of expected count >= 5, the rest pooled in one cell.

False-failure rate: the test fails when the p-value is below 1e-4, so a correct engine fails it about once in
10,000 runs (per method). It can fail: the same samples are also tested against the draft's own distribution, which
a wrong rule (keeping every draft) would produce, and that test must reject it.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from inference.engine import Config, LLMEngine, SamplingParams
from tests.inference.engine.support import random_prompts

NUM_SAMPLES = 4000
TEMPERATURE, TOP_K = 0.8, 5
ALPHA = 1e-4
FIRST_TOKEN = 1234


def _filtered(logits: torch.Tensor) -> torch.Tensor:
    # logits: [V] float32 -> the distribution the sampler draws from at TEMPERATURE and TOP_K, over token ids
    top = torch.topk(logits / TEMPERATURE, TOP_K)
    probs = torch.zeros_like(logits)
    probs[top.indices] = torch.softmax(top.values, dim=-1)
    return probs


def _joint(next_logits, context: list[int]) -> dict[tuple[int, int], float]:
    """P(t2, t3 | context) where next_logits(ids) gives the logits after ids."""
    p2 = _filtered(next_logits(context))
    joint = {}
    for t2 in p2.nonzero().flatten().tolist():
        p3 = _filtered(next_logits(context + [t2]))
        for t3 in p3.nonzero().flatten().tolist():
            joint[(t2, t3)] = float(p2[t2] * p3[t3])
    return joint


def _chi_square_p_value(counts: Counter, expected_probs: dict, n: int) -> float:
    cells, pooled_observed = [], n
    for cell, prob in expected_probs.items():
        if prob * n >= 5:
            cells.append((counts.get(cell, 0), prob * n))
            pooled_observed -= counts.get(cell, 0)
    pooled_expected = n - sum(e for _, e in cells)  # everything else, impossible outcomes included
    if pooled_expected > 1e-9:
        cells.append((pooled_observed, pooled_expected))
    elif pooled_observed:
        return 0.0  # outcomes the distribution gives no mass at all
    statistic = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _logits_fn(hf, num_layers: int | None = None):
    """Logits after a list of ids: the full model, or its first num_layers layers + norm + lm_head."""
    @torch.inference_mode()
    def run(ids: list[int]) -> torch.Tensor:
        out = hf.model(torch.tensor([ids]), output_hidden_states=True)
        hidden = out.last_hidden_state if num_layers is None else hf.model.norm(out.hidden_states[num_layers])
        return hf.lm_head(hidden)[0, -1].float()
    return run


def _sample(tiny_model_dir, prompt: list[int], spec: dict) -> tuple[Counter, dict]:
    prefill = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, dtype="float32",
                               kv_cache_bytes=8 << 20))
    prefill.add_request("p", prompt, SamplingParams(max_tokens=4))
    (out,) = [o for _ in range(10) for o in prefill.step()][:1]
    k, v = out.kv
    decode = LLMEngine(Config(model=tiny_model_dir, role="decode", threads=1, dtype="float32", block_size=4,
                              kv_cache_bytes=64 << 20, max_num_seqs=256, speculative=spec))
    params = SamplingParams(max_tokens=4, temperature=TEMPERATURE, top_k=TOP_K, ignore_eos=True)
    for i in range(NUM_SAMPLES):
        decode.add_prefilled(f"s{i}", prompt, FIRST_TOKEN, params, k, v)
    tokens: dict[str, list[int]] = {}
    while decode.has_unfinished():
        for o in decode.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert len(tokens) == NUM_SAMPLES and all(len(t) == 3 for t in tokens.values())
    return Counter((t[0], t[1]) for t in tokens.values()), decode.stats()


def test_layer_drafts_keep_the_models_distribution_of_the_next_two_tokens(tiny_model_dir, hf):
    prompt = random_prompts([12], seed=5)[0]
    counts, stats = _sample(tiny_model_dir, prompt,
                            {"method": "layers", "num_tokens": 2, "layers": 3, "min_acceptance": 0})
    # Both paths of the rule ran: drafts kept and drafts rejected.
    assert 0.05 * stats["num_spec_proposed_tokens"] < stats["num_spec_accepted_tokens"] \
        < 0.95 * stats["num_spec_proposed_tokens"], stats
    context = prompt + [FIRST_TOKEN]
    p_value = _chi_square_p_value(counts, _joint(_logits_fn(hf), context), NUM_SAMPLES)
    assert p_value >= ALPHA, f"the (t2, t3) samples do not follow the model (p = {p_value:.2g})"
    # Power: the draft's own distribution (what keeping every draft would give) is told apart.
    draft_p_value = _chi_square_p_value(counts, _joint(_logits_fn(hf, 3), context), NUM_SAMPLES)
    assert draft_p_value < ALPHA, f"the test cannot tell the draft's distribution from the model's ({draft_p_value})"


def test_ngram_drafts_keep_the_models_distribution_of_the_next_two_tokens(tiny_model_dir, hf):
    # The prompt holds FIRST_TOKEN once, followed by c and the tail's first token d: with ngram_max 1 those are
    # the drafts of every request's first step (a point mass q). The tiny model's distributions are peaked and
    # depend on c itself, so c is searched for (breadth first through the tokens the model can sample there) until
    # the model gives it a probability between 0.05 and 0.95: then drafts are both kept and rejected.
    head, tail = random_prompts([6, 6], seed=9)
    full = _logits_fn(hf)
    queue, seen, c = [77], set(), None
    while queue and len(seen) < 200:
        candidate = queue.pop(0)
        if candidate in seen:
            continue
        seen.add(candidate)
        p2 = _filtered(full(head + [FIRST_TOKEN, candidate] + tail + [FIRST_TOKEN]))
        if 0.05 < p2[candidate] < 0.95:
            c = candidate
            break
        queue += p2.nonzero().flatten().tolist()
    assert c is not None, "no draft token the model samples with a probability in (0.05, 0.95)"
    prompt, d = head + [FIRST_TOKEN, c] + tail, tail[0]
    assert prompt.count(FIRST_TOKEN) == 1
    counts, stats = _sample(tiny_model_dir, prompt,
                            {"method": "ngram", "num_tokens": 2, "ngram_min": 1, "ngram_max": 1,
                             "min_acceptance": 0})
    assert stats["num_spec_proposed_tokens"] >= 2 * NUM_SAMPLES
    assert 0 < stats["num_spec_accepted_tokens"] < stats["num_spec_proposed_tokens"], stats
    joint = _joint(full, prompt + [FIRST_TOKEN])
    p_value = _chi_square_p_value(counts, joint, NUM_SAMPLES)
    assert p_value >= ALPHA, f"the (t2, t3) samples do not follow the model (p = {p_value:.2g})"
    # Power: had every draft been kept, (c, d) would be all there is.
    always_kept = {(c, d): 1.0}
    assert _chi_square_p_value(counts, always_kept, NUM_SAMPLES) < ALPHA
