"""Stored profiles as one simulated-worker profile (`python -m inference.worker --simulate PROFILE`,
docs/simulated-worker.md), for `tandem_profile --export`. Writes nothing: Profile rows in (each one's revision and
deployment read for the name), a dict out.

The stage costs need no conversion: a Profile's `fits` and a simulated worker's role entry share one format
(inference/stage_costs.py), so each fitted stage is copied as stored. The KV layout the simulated worker carries on
the wire is kept tiny on purpose (its rule); the real cost is kv_bytes_per_token.
"""
from __future__ import annotations

FORMAT = 1
_WIRE_LAYOUT = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": "float32"}
_STAGES = {"prefill": ("prefill",), "decode": ("decode",), "colocated": ("prefill", "decode")}


def profiles_export(profiles) -> dict:
    """Profiles of one revision and node class (any roles) → one simulated-worker profile object."""
    profiles = list(profiles)
    if not profiles:
        raise ValueError("no profile to export")
    first = profiles[0]
    roles = {}
    max_model_len = min(int((p.info or {}).get("max_model_len") or 2048) for p in profiles)
    for p in profiles:
        kv_bytes = max(1, p.kv_bytes_per_token)
        entry = {"kv_bytes_per_token": kv_bytes, "kv_cache_bytes": max(kv_bytes, p.kv_capacity_tokens * kv_bytes)}
        entry.update({stage: dict(p.fits[stage]) for stage in _STAGES[p.role] if stage in (p.fits or {})})
        roles[p.role] = entry
    name = f"{first.revision.deployment.name}-r{first.revision.number}-{first.node_class}"
    return {"format": FORMAT, "name": name, "max_model_len": max(2, max_model_len), "vocab_size": 512,
            "kv_layout": dict(_WIRE_LAYOUT), "roles": roles}
