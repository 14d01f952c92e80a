"""From a profile's measured points to what the planner uses: the stored fits (`profile_fits`, `refit`), the
simulation's StageModel with the per-request overhead calibrated on the run's saturation burst
(`model_from_points`), and whether a live point still agrees with its fit (`fit_vs_live`). Pure; used by the profile
services, the capacity page's checks and the validation bench alike."""
from __future__ import annotations

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve, fit_decode, fit_prefill
from controlplane.capacity.sizing.simulation import StageModel, calibrate_overhead

# A live point this far from its fit (either way) means the profile no longer describes the workers: a quick
# profile on a busy host, another host, other settings. The planner would size pools from the wrong curve.
DISAGREE_FACTOR = 2.0


def kv_seconds_per_token(points: dict) -> float:
    """The KV push of a lone request per prompt token: at higher concurrency the figure includes waiting for a busy
    decode worker, which the simulation counts as decode queueing already."""
    transfers = [p["kv_transfer_s"] / p["prompt_tokens"] for p in points.get("decode", [])
                 if p.get("kv_transfer_s") is not None and p.get("prompt_tokens") and p.get("batch") == 1]
    return sum(transfers) / len(transfers) if transfers else 0.0


def model_from_points(points: dict, *, layout: str, max_num_seqs: int, max_batch_tokens: int,
                      kv_capacity_tokens: int) -> StageModel:
    """Fitted curves, and the request overhead that makes the burst's simulated length match the measured one."""
    burst = (points.get("saturation") or [None])[0]
    model = StageModel(prefill=fit_prefill(points["prefill"]), decode=fit_decode(points["decode"]),
                       max_num_seqs=max_num_seqs, max_batch_tokens=max_batch_tokens,
                       kv_capacity_tokens=kv_capacity_tokens)
    if burst is None:
        return model
    kv_s = kv_seconds_per_token(points) * burst["prompt_tokens"] if layout == "disaggregated" else 0.0
    model = StageModel(prefill=model.prefill, decode=model.decode, max_num_seqs=max_num_seqs,
                       max_batch_tokens=max_batch_tokens, kv_capacity_tokens=kv_capacity_tokens, kv_transfer_s=kv_s)
    overhead = calibrate_overhead(model, layout=layout, num_requests=burst["requests"],
                                  prompt_tokens=burst["prompt_tokens"], output_tokens=burst["output_tokens"],
                                  wall_s=burst["wall_s"])
    return StageModel(prefill=model.prefill, decode=model.decode, max_num_seqs=max_num_seqs,
                      max_batch_tokens=max_batch_tokens, kv_capacity_tokens=kv_capacity_tokens, kv_transfer_s=kv_s,
                      request_overhead_s=overhead)


def profile_fits(points: dict) -> dict:
    """A profile's `fits` from its points: {"prefill": {a, b, c}, "decode": {a, b, c}, "kv_transfer":
    {"seconds_per_token"}, "overhead": {"request_s"}}, each part only where the points allow it."""
    fits = {}
    prefill = points.get("prefill") or []
    decode = points.get("decode") or []
    if len({p["batch_tokens"] for p in prefill}) >= 2:
        fits["prefill"] = fit_prefill(prefill).as_dict()
    if len({p["batch"] for p in decode}) >= 2:
        fits["decode"] = fit_decode(decode).as_dict()
    if any(p.get("kv_transfer_s") is not None and p.get("batch") == 1 for p in decode):
        fits["kv_transfer"] = {"seconds_per_token": kv_seconds_per_token(points)}
    bursts = [p for p in points.get("saturation") or [] if p.get("request_overhead_s") is not None]
    if bursts:
        fits["overhead"] = {"request_s": bursts[-1]["request_overhead_s"]}
    return fits


def refit(points: dict) -> dict:
    """Fits from synthetic points, plus the live decode points (a live P50 ITL is a step time); live prefill
    points stay out (a live TTFT includes queueing)."""
    return profile_fits({stage: [p for p in ps if p.get("source") != "live" or stage == "decode"]
                         for stage, ps in points.items()})


def fit_vs_live(stage: str, fit: dict, point: dict, *, factor: float = DISAGREE_FACTOR) -> dict:
    """One live point against what its stage's fit predicts at the same load:
    {"stage", "live_s", "fitted_s", "ratio" (live ÷ fitted; None when the fit predicts 0), "disagrees", "point"}.

    Prefill: the live P50 TTFT of prompts of the mean length against the fit's step for one such prompt (a TTFT
    also holds the time in the queue, so a live value above the fit may be queueing; one below it cannot be).
    Decode: the live P50 inter-token latency against the fit's step at the live batch and context."""
    if stage == "prefill":
        fitted = PrefillCurve(**fit).step_seconds(float(point["batch_tokens"]))
        live = float(point["latency_s"])
    else:
        fitted = DecodeCurve(**fit).step_seconds(float(point["batch"]), float(point["context"]))
        live = float(point["step_s"])
    ratio = live / fitted if fitted > 0 else None
    disagrees = ratio is None or not 1 / factor <= ratio <= factor
    return {"stage": stage, "live_s": live, "fitted_s": fitted, "ratio": ratio, "disagrees": disagrees,
            "point": point}
