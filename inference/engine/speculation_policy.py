"""Speculative decoding, the torch-free part: the setting, the n-gram proposer, how many tokens each sequence may
draft this step, and when a sequence stops drafting. The device side (layer drafts, the verify forward, the
acceptance rule) is `speculation_forward.py`.

A decode step with speculation feeds each decoding sequence [last token, d1..dk] in one forward and keeps the longest
accepted prefix of the drafts plus the model's own next token, so a step yields 1..k+1 tokens.

How many drafts a sequence gets (`Speculator.plan`): at most `num_tokens`, and no more than
- max_tokens - completion tokens - 1 and max_model_len - tokens - 1: a step never produces past the request's end;
- the slots its blocks hold past its last token. A colocated sequence first takes free blocks for them (never
  preempting anyone for a draft); a decode-role sequence reserved its whole future up front (prompt + max_tokens - 1
  slots) and gets no more, so the max_tokens cap keeps every write inside that reservation.

When a sequence stops drafting (the off rule): a sequence starts, and comes back from each pause, probing: it
drafts one token per step (a probe that fails costs a verify of two tokens, and for layer drafts one draft pass,
instead of k), until a window passes (min_acceptance 0 turns the whole rule off: never a probe, never a pause).
Every WINDOW verify steps that carried drafts, if fewer than
`min_acceptance` of their drafts were accepted, the sequence pauses drafting for `pause` decode steps (starting at
PAUSE_MIN, times PAUSE_GROWTH on each pause in a row, up to PAUSE_MAX); a window that passes resets the pause. A
sequence on general chat thus spends WINDOW steps of its first ~PAUSE_MIN, then of ~PAUSE_MIN * PAUSE_GROWTH, ... on
drafts that fail (6 of its first 100 steps, 8 of its first 340, then 2 in 512), and one that turns copy-heavy later
(quoting its prompt) finds its way back at the next probe. An n-gram step without a match drafts nothing and costs
nothing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from weakref import WeakKeyDictionary

from inference.checks import is_int, is_number
from inference.engine.block_manager import BlockManager
from inference.engine.sequence import Sequence
from inference.roles import Role

METHODS = ("ngram", "layers")
MAX_NUM_TOKENS = 16
MAX_NGRAM = 16
# The off rule (module docstring).
WINDOW = 2
PAUSE_MIN, PAUSE_GROWTH, PAUSE_MAX = 16, 4, 512
# The acceptance below which drafting costs more than it saves. An n-gram draft costs only its rows in the verify
# forward; a layer draft also costs L layers of a forward and an lm_head per drafted token.
DEFAULT_MIN_ACCEPTANCE = {"ngram": 0.2, "layers": 0.5}
_KEYS = {"ngram": ("method", "num_tokens", "ngram_max", "ngram_min", "min_acceptance"),
         "layers": ("method", "num_tokens", "layers", "min_acceptance")}


class SpeculativeError(ValueError):
    """A bad `speculative` setting; `key` names the key inside it ("num_tokens"), or "" for the whole value."""

    def __init__(self, key: str, requirement: str):
        super().__init__(f"{key} {requirement}" if key else requirement)
        self.key, self.requirement = key, requirement


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_tokens: int
    ngram_max: int | None = None  # ngram: the longest suffix matched earlier in the sequence
    ngram_min: int | None = None  # ngram: the shortest
    layers: int | None = None  # layers: the draft's depth
    min_acceptance: float = 0.0

    def as_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


def parse_speculative(value) -> SpeculativeConfig | None:
    """None (off) or {"method": "ngram" | "layers", "num_tokens": k, ...} -> SpeculativeConfig; SpeculativeError
    naming the key otherwise. ngram takes ngram_max (default 4) and ngram_min (default 2); layers takes layers (the
    draft depth, required; checked against the model's depth when it loads); both take min_acceptance (0..1)."""
    if value is None:
        return None
    if isinstance(value, SpeculativeConfig):
        return value
    if not isinstance(value, dict):
        raise SpeculativeError("", f"must be null or an object such as {{\"method\": \"ngram\", \"num_tokens\": 4}}, "
                                   f"got {value!r}")
    method = value.get("method")
    if method not in METHODS:
        raise SpeculativeError("method", f"must be one of {', '.join(METHODS)}, got {method!r}")
    unknown = sorted(set(value) - set(_KEYS[method]))
    if unknown:
        raise SpeculativeError(unknown[0], f"is not a key of method {method} (its keys: {', '.join(_KEYS[method])})")

    def positive(key: str, default: int | None, high: int) -> int:
        item = value.get(key, default)
        if not is_int(item) or not 1 <= item <= high:
            raise SpeculativeError(key, f"must be an integer in 1..{high}, got {item!r}")
        return item

    num_tokens = positive("num_tokens", None, MAX_NUM_TOKENS)
    min_acceptance = value.get("min_acceptance", DEFAULT_MIN_ACCEPTANCE[method])
    if not is_number(min_acceptance) or not 0 <= min_acceptance <= 1:
        raise SpeculativeError("min_acceptance", f"must be a number in 0..1, got {min_acceptance!r}")
    if method == "layers":
        return SpeculativeConfig(method, num_tokens, layers=positive("layers", None, 1024),
                                 min_acceptance=float(min_acceptance))
    ngram_max = positive("ngram_max", 4, MAX_NGRAM)
    ngram_min = positive("ngram_min", min(2, ngram_max), MAX_NGRAM)
    if ngram_min > ngram_max:
        raise SpeculativeError("ngram_min", f"must be at most ngram_max ({ngram_max}), got {ngram_min}")
    return SpeculativeConfig(method, num_tokens, ngram_max=ngram_max, ngram_min=ngram_min,
                             min_acceptance=float(min_acceptance))


def propose_ngram(token_ids: list[int], *, ngram_max: int, ngram_min: int, num_tokens: int) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n tokens
    (longest n first, ngram_max down to ngram_min), at most num_tokens of them; [] when nothing matches."""
    num = len(token_ids)
    for n in range(min(ngram_max, num - 1), ngram_min - 1, -1):
        suffix = token_ids[num - n:]
        last = suffix[-1]
        # Scan backwards for the suffix's last token, then compare the rest: the latest match wins (a copy in
        # progress continues from where it is).
        end = num - 2  # index of the candidate's last token; the suffix itself ends at num - 1
        while end >= n - 1:
            if token_ids[end] == last and token_ids[end - n + 1:end + 1] == suffix:
                follow = token_ids[end + 1:end + 1 + num_tokens]
                if follow:
                    return follow
            end -= 1
    return []


class _SeqState:
    __slots__ = ("num_window_steps", "num_window_proposed", "num_window_accepted", "pause", "paused_for", "probing")

    def __init__(self, probing: bool):
        self.num_window_steps = self.num_window_proposed = self.num_window_accepted = 0
        self.pause = PAUSE_MIN
        self.paused_for = 0  # decode steps left without drafts
        self.probing = probing  # one draft per step until a window passes


class Speculator:
    """Plans each decode step's drafts and keeps the counts; `decoder` (speculation_forward.SpecDecoder) runs the device
    side. The engine calls `step` in place of the model runner's run for a decode step."""

    def __init__(self, config: SpeculativeConfig, *, decoder, block_manager: BlockManager, max_model_len: int,
                 role: Role):
        self.config = config
        self.decoder = decoder
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.role = role
        self._states: WeakKeyDictionary[Sequence, _SeqState] = WeakKeyDictionary()
        self.num_proposed_tokens = 0  # drafts fed to verify forwards
        self.num_accepted_tokens = 0  # drafts the verify kept
        self.num_verify_steps = 0
        self.num_draft_tokens_fed = 0  # the last step's drafts (the engine counts them as fed tokens)

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """One decode step of `seqs` (each scheduled for one token, its slot held): the new tokens of each."""
        self.decoder.import_kv(seqs)
        budgets = [self.plan(seq) for seq in seqs]
        self.num_draft_tokens_fed = 0
        if not any(budgets):
            return [[token_id] for token_id in self.decoder.decode(seqs)]
        if self.config.method == "ngram":
            drafts = [propose_ngram(seq.token_ids, ngram_max=self.config.ngram_max, ngram_min=self.config.ngram_min,
                                    num_tokens=k) if k else [] for seq, k in zip(seqs, budgets)]
            if not any(drafts):
                return [[token_id] for token_id in self.decoder.decode(seqs)]
            draft_probs = None
        else:
            drafts, draft_probs = self.decoder.draft_layers(seqs, budgets, self.config.layers)
        results = self.decoder.verify(seqs, drafts, draft_probs)  # [(tokens, num_accepted)]
        self.num_verify_steps += 1
        for seq, draft, (_, num_accepted) in zip(seqs, drafts, results):
            if draft:
                self._record(seq, len(draft), num_accepted)
        self.num_draft_tokens_fed = sum(len(draft) for draft in drafts)
        return [tokens for tokens, _ in results]

    def plan(self, seq: Sequence) -> int:
        """How many tokens `seq` may draft this step (module docstring); 0: a plain decode for it."""
        if seq.params.adjusts_logits:
            # Logit bias and penalties (which change with every drafted token) are the sampler's alone: the
            # acceptance rule knows only the model's distribution, so such a request decodes one token a step.
            return 0
        state = self._states.get(seq)
        if state is None:
            state = self._states[seq] = _SeqState(probing=self.config.min_acceptance > 0)
        if state.paused_for:
            state.paused_for -= 1
            return 0
        k = min(1 if state.probing else self.config.num_tokens, seq.params.max_tokens - seq.num_completion_tokens - 1,
                self.max_model_len - seq.num_tokens - 1)
        if k <= 0:
            return 0
        # Slots for positions num_tokens - 1 .. num_tokens - 1 + k: the decode slot is held already.
        num_slots = (self.block_manager.grow(seq, seq.num_tokens + k) if self.role is Role.COLOCATED
                     else len(seq.block_table) * self.block_manager.block_size)
        return max(0, min(k, num_slots - seq.num_tokens))

    def _record(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        self.num_proposed_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        state = self._states[seq]
        state.num_window_steps += 1
        state.num_window_proposed += num_proposed
        state.num_window_accepted += num_accepted
        if state.num_window_steps < WINDOW:
            return
        if state.num_window_accepted < self.config.min_acceptance * state.num_window_proposed:
            state.paused_for = state.pause
            state.pause = min(PAUSE_GROWTH * state.pause, PAUSE_MAX)
            state.probing = True
        else:
            state.pause = PAUSE_MIN
            state.probing = False
        state.num_window_steps = state.num_window_proposed = state.num_window_accepted = 0

    def stats(self) -> dict:
        return {"num_spec_proposed_tokens": self.num_proposed_tokens,
                "num_spec_accepted_tokens": self.num_accepted_tokens,
                "num_spec_verify_steps": self.num_verify_steps}
