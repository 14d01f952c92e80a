"""From a profile run's points to the simulation's StageModel, with the per-request overhead calibrated on the
run's saturation burst. Pure; used by the profile service and the validation bench alike."""
from __future__ import annotations

from controlplane.capacity.curves import fit_decode, fit_prefill
from controlplane.capacity.simulate import StageModel, calibrate_overhead


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
