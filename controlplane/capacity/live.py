"""Live refinement: points from the scraped series, at the loads operators actually run, added to the current
revision's profiles as source "live" (plotted apart from the synthetic ones).

Decode: the pool's P50 inter-token latency is the step time at the batch each worker ran (requests running ÷ ready
workers) and the context of the traffic (mean prompt + half the mean output); these points join the decode fit.
Prefill: the P50 TTFT at the mean prompt length is recorded but kept out of the prefill fit, since it includes the
time a prompt waited in the queue, which the planner's simulation adds by itself.

Checks: a profile the live points contradict (more than DISAGREE_FACTOR apart, either way) is named on the
capacity page, so that nobody plans from it without a new profile.
"""
from __future__ import annotations

import time

from django.db import transaction
from django.utils import timezone

from controlplane.capacity.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.models import Profile
from controlplane.capacity.planning import profiles_of
from controlplane.capacity.profiles import refit
from controlplane.models import Deployment, DeploymentMode, Worker, WorkerStatus
from controlplane.observability.series import metric_values

MAX_LIVE_POINTS = 200  # per stage and profile: the newest are kept


def _value(deployment, metric: str, role: str, window_s: float, now: float) -> float | None:
    values = metric_values(metric=metric, deployment=deployment, role=role, aggregation="avg", window_s=window_s,
                           now=now)
    return values[0].value if values else None


def live_points(deployment: Deployment, *, window_s: float = 300, now: float | None = None) -> dict:
    """{"prefill": [point], "decode": [point]} observed over the last window (empty lists without traffic)."""
    now = time.time() if now is None else now
    colocated = deployment.mode == DeploymentMode.COLOCATED
    entry, exit_ = ("colocated", "colocated") if colocated else ("prefill", "decode")
    qps = _value(deployment, "qps", entry, window_s, now)
    if not qps:
        return {"prefill": [], "decode": []}
    prompt = (_value(deployment, "prompt_tokens_per_second", entry, window_s, now) or 0) / qps
    output = (_value(deployment, "generation_tokens_per_second", exit_, window_s, now) or 0) / qps
    points = {"prefill": [], "decode": []}
    ttft = _value(deployment, "ttft_p50_seconds", entry, window_s, now)
    if ttft is not None and prompt >= 1:
        points["prefill"].append({"prompt_tokens": round(prompt), "batch": 1, "batch_tokens": round(prompt),
                                  "latency_s": ttft, "qps": qps, "source": "live", "ts": now})
    itl = _value(deployment, "itl_p50_seconds", exit_, window_s, now)
    itl_p99 = _value(deployment, "itl_p99_seconds", exit_, window_s, now)
    running = _value(deployment, "requests_running", exit_, window_s, now)
    workers = Worker.objects.filter(deployment=deployment, role=exit_, status=WorkerStatus.READY).count()
    if itl is not None and running and workers:
        batch = max(1.0, running / workers)
        points["decode"].append({"batch": round(batch, 2), "context": round(prompt + output / 2), "step_s": itl,
                                 "step_p99_s": itl_p99, "qps": qps, "source": "live", "ts": now})
    return points


def profile_live_refine(*, deployment: Deployment, window_s: float = 300, now: float | None = None) -> int:
    """Add the live points of the last window to the current revision's profiles and refit; returns how many
    points were added."""
    points = live_points(deployment, window_s=window_s, now=now)
    added = 0
    with transaction.atomic():
        for profile in Profile.objects.select_for_update().filter(revision=deployment.current_revision_id):
            stages = {"prefill": ("prefill",), "decode": ("decode",), "colocated": ("prefill", "decode")}[profile.role]
            merged = dict(profile.points or {})
            for stage in stages:
                if points[stage]:
                    kept = [p for p in merged.get(stage, []) if p.get("source") == "live"][-(MAX_LIVE_POINTS - 1):]
                    synthetic = [p for p in merged.get(stage, []) if p.get("source") != "live"]
                    merged[stage] = synthetic + kept + points[stage]
                    added += len(points[stage])
            if merged != profile.points:
                profile.points = merged
                profile.fits = refit(merged)
                profile.updated_at = timezone.now()
                profile.save(update_fields=["points", "fits", "updated_at"])
    return added


def live_refine_all(*, now: float | None = None) -> int:
    """Every deployment whose current revision has a profile."""
    ids = Profile.objects.values_list("revision__deployment_id", flat=True).distinct()
    return sum(profile_live_refine(deployment=d, now=now) for d in Deployment.objects.filter(pk__in=list(ids)))


# A live point this far from its fit (either way) means the profile no longer describes the workers: a quick
# profile on a busy host, another host, other settings. The planner would size pools from the wrong curve.
DISAGREE_FACTOR = 2.0


def fit_vs_live(stage: str, fit: dict, point: dict, *, factor: float = DISAGREE_FACTOR) -> dict:
    """One live point against what its stage's fit predicts at the same load (pure):
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


def profile_checks(deployment: Deployment, *, live: dict | None = None, window_s: float = 300,
                   now: float | None = None) -> list[dict]:
    """The planner's profiles (planning.profiles_of) against the live points of the last window (`live`, else
    read), or, without traffic now, against the newest live point a profile has stored: fit_vs_live of each stage
    with both, plus "role" and "node_class" of the profile and "current" (the point is of the last window)."""
    profiles = profiles_of(deployment)
    live = live_points(deployment, window_s=window_s, now=now) if live is None else live
    checks = []
    for stage in ("prefill", "decode"):
        profile = profiles.get(stage) or profiles.get("colocated")
        fit = (profile.fits or {}).get(stage) if profile else None
        if not fit:
            continue
        current = bool(live[stage])
        stored = [p for p in (profile.points or {}).get(stage, []) if p.get("source") == "live"]
        point = live[stage][-1] if current else (stored[-1] if stored else None)
        if point is None:
            continue
        checks.append({**fit_vs_live(stage, fit, point), "role": profile.role, "node_class": profile.node_class,
                       "current": current})
    return checks
