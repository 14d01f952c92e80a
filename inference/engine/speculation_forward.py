"""Speculative decoding, the device part: layer drafts, the verify forward, and the acceptance rule.

Verify: each sequence with drafts feeds [last token, d1..dk] at positions n-1 .. n-1+k as a chunk after its cached
tokens (the chunked-prefill attention: causal within the chunk, over the whole cached context), and each sequence
without drafts feeds its last token as a plain decode, all in one forward; logits come back for every fed position.

Acceptance, per sequence:
- greedy: d_j is kept while it equals the argmax after d_1..d_{j-1}; then the argmax at the first miss (or after
  d_k) follows. Token for token what the engine without speculation produces.
- sampling: the standard rejection rule (Leviathan et al. 2023, Chen et al. 2023), so that each token is distributed
  as the model's own: p_j is the model's distribution at position j after the sampler's temperature, top-k and top-p
  (`Sampler._filtered_probs`, the very same filtering), q_j the draft's (for layer drafts: the same filtering of the
  draft's logits, and d_j drawn from it; for n-gram drafts a point mass on d_j). d_j is kept with probability
  min(1, p_j(d_j) / q_j(d_j)); at the first rejection the token is drawn from normalize(max(0, p_j - q_j)) and the
  step ends; when every draft is kept a bonus token is drawn from p_k.

Layer drafts (self-speculation): k steps of the first L layers, the final norm and lm_head, one token per step, for
every drafting sequence at once. Each draft step writes its token's K/V of layers < L into the cache slots the verify
forward writes again for all layers: for accepted tokens the verify's K/V of those layers is what the draft computed
(the same layers on the same inputs), so the draft borrows the cache instead of keeping a second one.

A seeded request draws from generators seeded from (seed, completion tokens so far), as the sampler's are, so that
its tokens depend only on itself; with speculation they are a different draw from the same distribution than
without it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.kernel_plan import KernelPlan
from inference.engine.sampler import Sampler, step_seed
from inference.engine.sequence import Sequence
from inference.engine.step_inputs import Chunk, StepInputs

# Salts that keep the verify's and the draft's draws apart from each other and from the sampler's.
_VERIFY_SALT = 0x5BD1E995
_DRAFT_SALT = 0x27D4EB2F


class SpecDecoder:
    """The forwards of speculative steps, over the runner's parts: `inputs` (step_inputs.StepInputs: the KV pool and
    the device), the reference `forward` (reference_forward.py: layer drafts run its first layers), the final norm
    and lm_head (`head`), the `sampler`, the kernels' `plan` (kernel_plan.py) and the runner's plain decode step
    (`decode`)."""

    def __init__(self, *, inputs: StepInputs, forward, head, sampler: Sampler, plan: KernelPlan,
                 decode: Callable[[list[Sequence]], list[int]], num_draft_layers: int | None = None):
        self.inputs, self.forward, self.head, self.sampler, self.plan = inputs, forward, head, sampler, plan
        self._decode = decode
        num_layers = inputs.pool.shape.num_layers
        if num_draft_layers is not None and not 1 <= num_draft_layers < num_layers:
            raise ValueError(f"speculative layers must be in 1..{num_layers - 1} for this model "
                             f"({num_layers} layers), got {num_draft_layers}")
        self.num_draft_layers = num_draft_layers

    # -- what the speculator calls --------------------------------------------------------------------------------

    def import_kv(self, seqs: list[Sequence]) -> None:
        self.inputs.pool.import_kv(seqs)

    def decode(self, seqs: list[Sequence]) -> list[int]:
        """A plain decode step (nobody drafts this step)."""
        return self._decode(seqs)

    @torch.inference_mode()
    def draft_layers(self, seqs: list[Sequence], budgets: list[int], num_layers: int
                     ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """budgets[i] draft tokens for seqs[i] from the first `num_layers` layers. Returns the drafts and, per
        sequence, the draft's distributions [k, V] (None for a greedy sequence, whose drafts are argmaxes)."""
        inputs = self.inputs
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        generators = {i: self._generator(seq, _DRAFT_SALT) for i, seq in enumerate(seqs) if budgets[i]}
        for step in range(max(budgets)):
            active = [i for i, k in enumerate(budgets) if k > step]
            group = [seqs[i] for i in active]
            positions = [seqs[i].num_tokens - 1 + step for i in active]
            input_ids = [drafts[i][-1] if step else seqs[i].last_token_id for i in active]
            slots = [slot for seq, pos in zip(group, positions) for slot in inputs.pool.slots(seq, pos, pos + 1)]
            attention = inputs.decode_attention(group, self.plan, [pos + 1 for pos in positions])
            hidden = self.forward(inputs.tensor(input_ids), inputs.tensor(positions), inputs.tensor(slots),
                                  attention, num_layers=num_layers)  # [B, hidden]
            logits = self.head(hidden).float()  # [B, V]
            for row, i in enumerate(active):
                seq = seqs[i]
                if seq.params.is_greedy:
                    drafts[i].append(int(logits[row].argmax()))
                    continue
                q = self._probs(logits[row:row + 1], seq)[0]  # [V]
                drafts[i].append(int(torch.multinomial(q, 1, generator=generators[i])))
                probs[i].append(q)
        return drafts, [torch.stack(p) if p else None for p in probs]

    @torch.inference_mode()
    def verify(self, seqs: list[Sequence], drafts: list[list[int]], draft_probs: list[torch.Tensor | None] | None
               ) -> list[tuple[list[int], int]]:
        """One forward over every sequence's last token and drafts; per sequence (its new tokens, drafts kept)."""
        drafting = [i for i, draft in enumerate(drafts) if draft]
        plain = [i for i, draft in enumerate(drafts) if not draft]
        # Each drafting sequence's [last token, d1..dk] at positions n-1 .. n-1+k: a chunk after its cached tokens.
        chunks = [Chunk(seqs[i], seqs[i].num_tokens - 1, [seqs[i].last_token_id, *drafts[i]]) for i in drafting]
        plain_seqs = [seqs[i] for i in plain]
        hidden = self.forward(*self.inputs.prepare(chunks, plain_seqs, self.plan))  # [T, hidden]
        logits = self.head(hidden).float()  # [T, V]
        results: list[tuple[list[int], int] | None] = [None] * len(seqs)
        start = 0
        for i, chunk in zip(drafting, chunks):
            end = start + len(chunk.token_ids)
            q = draft_probs[i] if draft_probs is not None else None
            results[i] = self._accept(seqs[i], logits[start:end], drafts[i], q)
            start = end
        if plain_seqs:  # the sampler itself: exactly the draw the engine without speculation makes
            tokens = self.sampler(logits[start:], plain_seqs)
            for i, token_id in zip(plain, tokens):
                results[i] = ([token_id], 0)
        return results

    # -- the acceptance rule --------------------------------------------------------------------------------------

    def _accept(self, seq: Sequence, logits: torch.Tensor, draft: list[int], q: torch.Tensor | None
                ) -> tuple[list[int], int]:
        # logits: [k+1, V] float32, row j: the model after [last token, d_1..d_j]; q: [k, V] or None (point mass)
        k = len(draft)
        if seq.params.is_greedy:
            targets = logits.argmax(dim=-1).tolist()
            num_accepted = 0
            while num_accepted < k and draft[num_accepted] == targets[num_accepted]:
                num_accepted += 1
            return draft[:num_accepted] + [targets[num_accepted]], num_accepted
        device = logits.device
        p = self._probs(logits, seq)  # [k+1, V]
        generator = self._generator(seq, _VERIFY_SALT)
        d = torch.tensor(draft, device=device).unsqueeze(1)  # [k, 1]
        p_d = p[:k].gather(1, d).squeeze(1)  # [k]
        q_d = torch.ones(k, device=device) if q is None else q.gather(1, d).squeeze(1)
        u = torch.rand(k, generator=generator, device=device)  # [k]
        rejected = (u * q_d > p_d).nonzero()
        if rejected.numel() == 0:
            return draft + [int(torch.multinomial(p[k], 1, generator=generator))], k
        j = int(rejected[0, 0])
        if q is None:
            residual = p[j].clone()
            residual[draft[j]] = 0.0
        else:
            residual = (p[j] - q[j]).clamp_(min=0.0)
        if not residual.sum() > 0:  # p_j == q_j to the last bit (a rejection is then all but impossible)
            residual = p[j]
        token_id = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return draft[:j] + [token_id], j

    @staticmethod
    def _probs(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
        """The sampler's distribution for `seq` (temperature, top-k, top-p) of each row, over token ids."""
        # logits: [R, V] -> [R, V]
        probs, order = Sampler._filtered_probs(logits, [seq] * logits.shape[0])
        if order is not None:  # over the best tokens by rank: back to all token ids
            probs = torch.zeros(logits.shape, dtype=probs.dtype, device=probs.device).scatter_(1, order, probs)
        return probs

    def _generator(self, seq: Sequence, salt: int) -> torch.Generator | None:
        if seq.params.seed is None:
            return None  # the process-wide generator, as the sampler's unseeded draws
        generator = torch.Generator(device=self.inputs.device)
        generator.manual_seed(step_seed(seq.params.seed ^ salt, seq.num_completion_tokens))
        return generator
