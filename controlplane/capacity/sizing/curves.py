"""Fitted stage curves of a profile: how a step's latency grows with its load. Pure (numpy, no Django).

    prefill step seconds (T tokens, prompts n_i)   = a + b·T + c·Σ n_i²  (c: attention, quadratic in each prompt)
    decode step seconds (batch B, mean context L)   = a + b·B + c·B·L   (c: reading every sequence's KV each step)

Fitted by least squares with every coefficient kept ≥ 0 (a negative term would predict a faster step under more
load, which extrapolates badly): coefficients that come out negative are dropped and the rest refitted.

The curves are the one stage-cost format's classes (inference/stage_costs.py: pure, shared with the simulated
worker's profiles), so a stored fit is what a simulated worker reads.
"""
from __future__ import annotations

import numpy as np

from inference.stage_costs import DecodeCost as DecodeCurve
from inference.stage_costs import PrefillCost as PrefillCurve

__all__ = ["DecodeCurve", "PrefillCurve", "fit_decode", "fit_prefill"]


def _nonnegative_lstsq(columns: list[np.ndarray], y: np.ndarray) -> list[float]:
    """Least squares y ≈ Σ coef_i · columns[i] with coef_i ≥ 0 (drop the negative ones, refit; at most len rounds)."""
    active = list(range(len(columns)))
    coef = [0.0] * len(columns)
    while active:
        x = np.stack([columns[i] for i in active], axis=1)  # x: [num_points, num_active]
        solution, *_ = np.linalg.lstsq(x, y, rcond=None)
        negative = [i for i, value in zip(active, solution) if value < 0]
        if not negative:
            for i, value in zip(active, solution):
                coef[i] = float(value)
            return coef
        # Drop the most negative term only: its removal can make the others positive.
        worst = min(negative, key=lambda i: solution[active.index(i)])
        active.remove(worst)
    return coef


def fit_prefill(points: list[dict]) -> PrefillCurve:
    """points: [{"prompt_tokens" n, "batch" k, "batch_tokens" k·n, "latency_s"}] (k prompts of n tokens at once:
    Σ n_i² = k·n²). Needs at least 2 distinct batch sizes in tokens (ValueError otherwise)."""
    tokens = np.array([float(p["batch_tokens"]) for p in points])
    sum_sq = np.array([float(p.get("batch", 1)) * float(p.get("prompt_tokens", p["batch_tokens"])) ** 2
                       for p in points])
    latency = np.array([float(p["latency_s"]) for p in points])
    if len(set(tokens.tolist())) < 2:
        raise ValueError("a prefill fit needs points at 2 or more batch sizes")
    scale = float(max(tokens.max(), 1.0))  # conditioning: n² of 4096 tokens is 1.7e7
    columns = [np.ones_like(tokens), tokens / scale]
    if len({p.get("prompt_tokens", p["batch_tokens"]) for p in points}) >= 3:
        columns.append(sum_sq / (scale * scale))
    coef = _nonnegative_lstsq(columns, latency) + [0.0]
    return PrefillCurve(a=coef[0], b=coef[1] / scale, c=coef[2] / (scale * scale))


def fit_decode(points: list[dict]) -> DecodeCurve:
    """points: [{"batch", "context", "step_s"}] (step_s: the mean inter-token latency at that load)."""
    batch = np.array([float(p["batch"]) for p in points])
    context = np.array([float(p["context"]) for p in points])
    step = np.array([float(p["step_s"]) for p in points])
    if len(set(batch.tolist())) < 2:
        raise ValueError("a decode fit needs points at 2 or more batch sizes")
    columns = [np.ones_like(batch), batch]
    bl_scale = float(max((batch * context).max(), 1.0))
    if len(set(context.tolist())) >= 2:
        columns.append(batch * context / bl_scale)
    coef = _nonnegative_lstsq(columns, step) + [0.0]
    return DecodeCurve(a=coef[0], b=coef[1], c=coef[2] / bl_scale)


def kv_bytes_per_token(kv_layout: dict) -> int:
    """K and V of one token across all layers, from a worker's /info kv_layout."""
    element = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(kv_layout.get("dtype")), 4)
    return 2 * int(kv_layout["num_layers"]) * int(kv_layout["num_kv_heads"]) * int(kv_layout["head_dim"]) * element
