"""Stage costs: how long one prefill step and one decode step take, in the one format that the capacity model
stores (a Profile's `fits`, controlplane/capacity/) and the simulated worker reads (its profile's roles,
inference/worker/sim_profile.py). Pure: no torch, no Django.

    prefill step seconds = a + b·T + c·Σ nᵢ²   (T tokens in the step, nᵢ each prompt's length: attention is
                                                quadratic in each prompt, not in the batch's total)
    decode step seconds  = a + b·B + c·B·L     (B sequences, L their mean context: B·L is the tokens the batch
                                                holds, whose KV every step reads)

Encoded per stage as {"a": ..., "b": ..., "c": ...}: seconds, seconds per token (per sequence for decode), and
seconds per squared prompt token (per token held for decode); each a number >= 0, c may be left out (0). A
profile run fits them (controlplane/capacity/sizing/curves.py, whose PrefillCurve and DecodeCurve are these terms
on the pure model's side), and `tandem_profile --export` writes them as they are stored.

Simulated-worker profiles written before this format spelled the stages `prefill_s: {base, per_token}` and
`decode_step_s: {base, per_seq, per_context_token}`: the same terms (prefill without the quadratic one), still read
by `legacy_costs`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from inference.checks import is_number

KEYS = ("a", "b", "c")


class StageCostError(ValueError):
    """A stage cost that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class PrefillCost:
    a: float
    b: float
    c: float = 0.0

    def step_seconds(self, batch_tokens: float, sum_sq_tokens: float | None = None) -> float:
        """A step over prompts of `batch_tokens` in all whose lengths squared sum to `sum_sq_tokens` (None: one
        prompt)."""
        sum_sq = batch_tokens * batch_tokens if sum_sq_tokens is None else sum_sq_tokens
        return self.a + self.b * batch_tokens + self.c * sum_sq

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DecodeCost:
    a: float
    b: float
    c: float = 0.0

    def step_seconds(self, batch: float, context: float) -> float:
        """One step of `batch` sequences of mean context `context` (every sequence gains a token)."""
        return self.a + self.b * batch + self.c * batch * context

    def as_dict(self) -> dict:
        return asdict(self)


def _terms(obj, where: str) -> dict[str, float]:
    if not isinstance(obj, dict):
        raise StageCostError(f"{where} must be an object with a, b and c (seconds, see docs)")
    unknown = set(obj) - set(KEYS)
    if unknown:
        raise StageCostError(f"{where} has unknown keys {sorted(unknown)} (allowed: a, b, c)")
    terms = {}
    for key in KEYS:
        value = obj.get(key, 0.0)
        if not is_number(value) or value < 0:
            raise StageCostError(f"{where}.{key} must be a number >= 0, got {value!r}")
        terms[key] = float(value)
    return terms


def prefill_cost(obj, where: str = "prefill") -> PrefillCost:
    """{"a", "b", "c"} → PrefillCost, or StageCostError naming `where` and the key."""
    return PrefillCost(**_terms(obj, where))


def decode_cost(obj, where: str = "decode") -> DecodeCost:
    """{"a", "b", "c"} → DecodeCost, or StageCostError naming `where` and the key."""
    return DecodeCost(**_terms(obj, where))


# The simulated worker's first spelling: key of the stage, and each old term's name in this format.
LEGACY = {"prefill": ("prefill_s", {"base": "a", "per_token": "b"}),
          "decode": ("decode_step_s", {"base": "a", "per_seq": "b", "per_context_token": "c"})}


def legacy_costs(entry: dict, where: str) -> dict:
    """A profile role entry with its stages in this format: `prefill_s` / `decode_step_s` (the old spelling) are
    renamed term by term; an entry that has both spellings of one stage is refused."""
    entry = dict(entry)
    for stage, (old_key, names) in LEGACY.items():
        if old_key not in entry:
            continue
        if stage in entry:
            raise StageCostError(f"{where} has both {stage} and {old_key} (the old spelling of {stage}): keep one")
        old = entry.pop(old_key)
        if not isinstance(old, dict):
            raise StageCostError(f"{where}.{old_key} must be an object with {', '.join(names)}")
        unknown = set(old) - set(names)
        if unknown:
            raise StageCostError(f"{where}.{old_key} has unknown keys {sorted(unknown)} "
                                 f"(allowed: {', '.join(names)})")
        renamed = {}
        for old_name, name in names.items():
            value = old.get(old_name, 0.0)
            if not is_number(value) or value < 0:
                raise StageCostError(f"{where}.{old_key}.{old_name} must be a number >= 0, got {value!r}")
            renamed[name] = value
        entry[stage] = renamed
    return entry
