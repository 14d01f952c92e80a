"""A performance profile: what a simulated worker of each role takes per prefill and per decode step.

The format (docs/simulated-worker.md) is a small JSON object, simple enough to be written by hand, and its stage
costs are the capacity model's (inference/stage_costs.py): a profile run's stored fits drop into a role as they are.

    {"format": 1, "name": "tiny-cpu", "max_model_len": 2048, "vocab_size": 512,
     "kv_layout": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": "float32"},
     "roles": {"prefill":   {"prefill": {"a": 0.004, "b": 0.00002}, "kv_bytes_per_token": 18432},
               "decode":    {"decode": {"a": 0.003, "b": 0.0002, "c": 1e-7},
                             "kv_bytes_per_token": 18432, "kv_cache_bytes": 268435456},
               "colocated": {...both...}}}

One prefill (one prompt of n tokens) takes a + b·n + c·n² seconds; one decode step (every running sequence gains a
token) takes a + b·batch size + c·tokens held by the batch. `kv_layout` is what the fake KV payload carries (keep it
small: it is the wire format, not the model's size); `kv_bytes_per_token` is the model's real cost, which the KV
usage gauge and admission account. The first spelling of the stages (`prefill_s`, `decode_step_s`) still loads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inference.checks import is_int, is_number
from inference.roles import Role
from inference.stage_costs import DecodeCost, PrefillCost, StageCostError, decode_cost, legacy_costs, prefill_cost

FORMAT = 1
DTYPES = ("float32", "bfloat16", "float16")


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class RoleProfile:
    prefill: PrefillCost | None
    decode: DecodeCost | None
    kv_bytes_per_token: int
    kv_cache_bytes: int

    def prefill_seconds(self, num_tokens: int) -> float:
        return self.prefill.step_seconds(num_tokens)

    def decode_step_seconds(self, num_seqs: int, num_context_tokens: int) -> float:
        """`num_context_tokens`: the tokens the whole batch holds (num_seqs × their mean context)."""
        d = self.decode
        return d.a + d.b * num_seqs + d.c * num_context_tokens


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    max_model_len: int
    vocab_size: int
    kv_layout: dict
    roles: dict[str, RoleProfile]

    def role(self, role: str) -> RoleProfile:
        if role not in self.roles:
            raise ProfileError(f"profile {self.name!r} has no entry for role {role!r} (it has {sorted(self.roles)})")
        return self.roles[role]


_TINY_CPU = {
    "format": FORMAT, "name": "tiny-cpu", "max_model_len": 2048, "vocab_size": 512,
    "kv_layout": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": "float32"},
    "roles": {
        "prefill": {"prefill": {"a": 0.004, "b": 0.00002}, "kv_bytes_per_token": 2048},
        "decode": {"decode": {"a": 0.003, "b": 0.0002, "c": 1e-7}, "kv_bytes_per_token": 2048,
                   "kv_cache_bytes": 64 << 20},
        "colocated": {"prefill": {"a": 0.004, "b": 0.00002}, "decode": {"a": 0.003, "b": 0.0002, "c": 1e-7},
                      "kv_bytes_per_token": 2048, "kv_cache_bytes": 64 << 20},
    },
}
# SmolLM2-135M on one loaded CPU core, rounded from bench/ runs: 30 layers, 3 KV heads of 64, float32.
_SMOLLM2_CPU = {
    "format": FORMAT, "name": "smollm2-cpu", "max_model_len": 8192, "vocab_size": 49152,
    "kv_layout": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": "float32"},
    "roles": {
        "prefill": {"prefill": {"a": 0.02, "b": 0.0006}, "kv_bytes_per_token": 46080},
        "decode": {"decode": {"a": 0.03, "b": 0.002, "c": 2e-7}, "kv_bytes_per_token": 46080,
                   "kv_cache_bytes": 1 << 30},
        "colocated": {"prefill": {"a": 0.02, "b": 0.0006}, "decode": {"a": 0.03, "b": 0.002, "c": 2e-7},
                      "kv_bytes_per_token": 46080, "kv_cache_bytes": 1 << 30},
    },
}
BUILTIN = {"tiny-cpu": _TINY_CPU, "smollm2-cpu": _SMOLLM2_CPU}


@dataclass(slots=True)
class SimSettings:
    """A simulated worker's engine settings, in place of the engine's Config: its profile, and the few engine flags
    it uses (the others, which only a model would use, are accepted and ignored)."""

    profile: Profile
    role: Role
    model: str  # names what it serves; never read
    max_num_seqs: int = 64


def load_profile(spec: str) -> Profile:
    """A built-in profile by name, or a JSON file by path."""
    if spec in BUILTIN:
        return parse_profile(BUILTIN[spec])
    path = Path(spec)
    if not path.is_file():
        raise ProfileError(f"no profile {spec!r}: give a JSON file or one of {', '.join(sorted(BUILTIN))}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ProfileError(f"profile {spec}: not readable JSON: {exc}") from None
    return parse_profile(data)


def _number(obj: dict, key: str, where: str, *, default=None, integer=False) -> float:
    value = obj.get(key, default)
    ok = is_int(value) if integer else is_number(value)
    if value is None or not ok or value < 0:
        raise ProfileError(f"{where}.{key} must be a {'whole ' if integer else ''}number >= 0, got {value!r}")
    return value


def parse_profile(data) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a JSON object")
    if data.get("format", FORMAT) != FORMAT:
        raise ProfileError(f"format must be {FORMAT}, got {data.get('format')!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError("name must be a non-empty string")
    max_model_len = _number(data, "max_model_len", "profile", integer=True)
    vocab_size = _number(data, "vocab_size", "profile", default=512, integer=True)
    if max_model_len < 2 or vocab_size < 2:
        raise ProfileError("max_model_len and vocab_size must be >= 2")
    layout = data.get("kv_layout")
    if not isinstance(layout, dict) or layout.get("dtype") not in DTYPES:
        raise ProfileError(f"kv_layout must be an object with dtype one of {', '.join(DTYPES)}")
    for key in ("num_layers", "num_kv_heads", "head_dim"):
        if _number(layout, key, "kv_layout", integer=True) < 1:
            raise ProfileError(f"kv_layout.{key} must be >= 1")
    roles_in = data.get("roles")
    if not isinstance(roles_in, dict) or not roles_in:
        raise ProfileError("roles must be an object keyed by prefill, decode, colocated")
    roles = {}
    for role, spec in roles_in.items():
        where = f"roles.{role}"
        if role not in {r.value for r in Role}:
            raise ProfileError(f"{where}: unknown role (use prefill, decode, colocated)")
        if not isinstance(spec, dict):
            raise ProfileError(f"{where} must be an object")
        try:
            spec = legacy_costs(spec, where)
            needs_prefill, needs_decode = role in ("prefill", "colocated"), role in ("decode", "colocated")
            if needs_prefill and "prefill" not in spec:
                raise ProfileError(f"{where}.prefill is required for the {role} role")
            if needs_decode and "decode" not in spec:
                raise ProfileError(f"{where}.decode is required for the {role} role")
            prefill = prefill_cost(spec["prefill"], f"{where}.prefill") if needs_prefill else None
            decode = decode_cost(spec["decode"], f"{where}.decode") if needs_decode else None
        except StageCostError as exc:
            raise ProfileError(str(exc)) from None
        roles[role] = RoleProfile(
            prefill=prefill, decode=decode,
            kv_bytes_per_token=int(_number(spec, "kv_bytes_per_token", where, integer=True)),
            kv_cache_bytes=int(_number(spec, "kv_cache_bytes", where, default=1 << 30, integer=True)),
        )
        if roles[role].kv_bytes_per_token < 1 or roles[role].kv_cache_bytes < roles[role].kv_bytes_per_token:
            raise ProfileError(f"{where}: kv_bytes_per_token must be >= 1 and kv_cache_bytes hold at least one")
    return Profile(name=name, max_model_len=int(max_model_len), vocab_size=int(vocab_size),
                   kv_layout={k: layout[k] for k in ("num_layers", "num_kv_heads", "head_dim", "dtype")},
                   roles=roles)
