"""Writes of Profile rows: a profile run's points stored (replacing the earlier synthetic ones), and live points
from the scraped series added to the current revision's profiles (selectors.live_points), each time refitted
(sizing.calibration.refit). Live points are kept apart by source "live", and plotted apart from the synthetic ones."""
from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.capacity.models import Profile
from controlplane.capacity.selectors import live_points
from controlplane.capacity.sizing.calibration import refit
from controlplane.capacity.sizing.curves import kv_bytes_per_token
from controlplane.models import Deployment
from controlplane.observability.reader import MetricsUnavailable

log = logging.getLogger(__name__)

MAX_LIVE_POINTS = 200  # per stage and profile: the newest are kept


def profile_save(*, revision, node_class: str, role: str, points: dict, info: dict) -> Profile:
    """Store synthetic points (replacing the earlier synthetic ones, keeping live ones) and refit."""
    with transaction.atomic():
        profile = Profile.objects.select_for_update().filter(revision=revision, node_class=node_class,
                                                             role=role).first()
        if profile is None:
            profile = Profile(revision=revision, node_class=node_class, role=role, points={})
        merged = {}
        for stage in ("prefill", "decode", "saturation"):
            kept = [p for p in (profile.points or {}).get(stage, []) if p.get("source") == "live"]
            new = points.get(stage, [])
            if new or kept:
                merged[stage] = list(new) + kept
        profile.points = merged
        profile.fits = refit(merged)
        layout = info.get("kv_layout") or {}
        profile.kv_bytes_per_token = kv_bytes_per_token(layout) if layout else 0
        profile.max_num_seqs = int(info.get("max_num_seqs") or 0)
        profile.max_batch_tokens = int(info.get("max_num_batched_tokens") or 0)
        profile.kv_capacity_tokens = int(info.get("num_kv_blocks") or 0) * int(layout.get("block_size") or 0)
        profile.info = info
        profile.updated_at = timezone.now()
        profile.save()
    return profile


def profile_live_refine(*, deployment: Deployment, window_s: float = 300, now: float | None = None) -> int:
    """Add the live points of the last window to the current revision's profiles and refit; returns how many
    points were added (none while the metrics backend does not answer: the next pass reads again)."""
    try:
        points = live_points(deployment, window_s=window_s, now=now)
    except MetricsUnavailable as exc:
        log.info("no live points for %s: %s", deployment.name, exc)
        return 0
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
