"""Stored profiles in the simulated worker's profile format (`python -m inference.worker --simulate PROFILE`,
format 1: docs/simulated-worker.md on the simulated-worker side). Writes nothing: Profile rows in (each one's
revision and deployment read for the name), a dict out.

Their prefill cost is linear in the prompt (base + per_token · tokens); ours has a quadratic term, so per_token is
the slope of our curve at the middle of the profiled prompt lengths (the secant from 0 to there). Their decode step
(base + per_seq · batch + per_context_token · tokens held by the batch) is ours term for term, since
batch · mean context = tokens held. The KV layout they carry on the wire is kept tiny on purpose (their rule); the
real cost is kv_bytes_per_token.
"""
from __future__ import annotations

FORMAT = 1
_WIRE_LAYOUT = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 2, "dtype": "float32"}


def _prefill(fits: dict, points: list[dict]) -> dict:
    f = fits["prefill"]
    lengths = sorted(p["prompt_tokens"] for p in points) or [128]
    middle = lengths[len(lengths) // 2]
    return {"base": round(max(f["a"], 0.0), 9), "per_token": round(max(f["b"] + f["c"] * middle, 0.0), 12)}


def _decode(fits: dict) -> dict:
    f = fits["decode"]
    return {"base": round(max(f["a"], 0.0), 9), "per_seq": round(max(f["b"], 0.0), 12),
            "per_context_token": round(max(f["c"], 0.0), 15)}


def profiles_export(profiles) -> dict:
    """Profiles of one revision and node class (any roles) → one format-1 profile object."""
    profiles = list(profiles)
    if not profiles:
        raise ValueError("no profile to export")
    first = profiles[0]
    roles = {}
    max_model_len = min(int((p.info or {}).get("max_model_len") or 2048) for p in profiles)
    for p in profiles:
        kv_bytes = max(1, p.kv_bytes_per_token)
        entry = {"kv_bytes_per_token": kv_bytes,
                 "kv_cache_bytes": max(kv_bytes, p.kv_capacity_tokens * kv_bytes)}
        if p.role in ("prefill", "colocated") and "prefill" in p.fits:
            entry["prefill_s"] = _prefill(p.fits, (p.points or {}).get("prefill", []))
        if p.role in ("decode", "colocated") and "decode" in p.fits:
            entry["decode_step_s"] = _decode(p.fits)
        roles[p.role] = entry
    name = f"{first.revision.deployment.name}-r{first.revision.number}-{first.node_class}"
    return {"format": FORMAT, "name": name, "max_model_len": max(2, max_model_len), "vocab_size": 512,
            "kv_layout": dict(_WIRE_LAYOUT), "roles": roles}
