"""The capacity page: the current revision's profiles (fits in words, plots with the live points against the
curves, a warning where live data contradicts a fit), profile runs with progress, and the planner with what-if
sliders and Apply, its objectives those of the deployment. The page reads and writes through the REST API (session
auth), like any client; its profile section is also served alone, so that a finished profile run shows in place."""
from __future__ import annotations

import math

from controlplane.capacity.selectors import (live_points, profile_checks, profile_job_latest, profile_list,
                                             schedule_rows)
from controlplane.capacity.sizing.calibration import DISAGREE_FACTOR
from controlplane.observability.reader import MetricsUnavailable
from dashboards.access import viewer_required
from dashboards.profiles import check_text, fit_lines, profile_figures
from dashboards.stages import objectives_of
from dashboards.views.common import page
from dashboards.views.pages import get_deployment_or_404

ITL_SLIDER_MAX_MS = 500  # at least; twice the deployment's ITL objective when that is more


def profiles_context(deployment) -> dict:
    """What the profile section shows: each profile with its fits in words, the figures, and the checks of the
    planner's profiles against live traffic."""
    profiles = list(profile_list(deployment))
    for profile in profiles:
        profile.fit_lines = fit_lines(profile.fits or {})
    live, metrics_error = {"prefill": [], "decode": []}, ""
    if profiles:
        try:
            live = live_points(deployment)
        except MetricsUnavailable as exc:  # the stored points still show; the page says why no live ones
            metrics_error = str(exc)
    checks = profile_checks(deployment, live=live) if profiles else []
    return {"deployment": deployment, "profiles": profiles, "figures": profile_figures(profiles, live_now=live),
            "disagreements": [check_text(check) for check in checks if check["disagrees"]],
            "agreements": [check_text(check) for check in checks if not check["disagrees"]],
            "disagree_factor": DISAGREE_FACTOR, "metrics_error": metrics_error}


def _plain(ms: float) -> float | int:
    """10000.0 → 10000 (an input shows "10000", not "10000.0"); else 3 decimals."""
    ms = round(ms, 3)
    return int(ms) if ms.is_integer() else ms


def plan_defaults(deployment) -> dict:
    """The planner's form: the deployment's own objectives (ms), and a slider wide enough to hold its ITL one."""
    objectives = objectives_of(deployment)
    ttft_ms, itl_ms = (_plain(objectives[name] * 1000) for name in ("ttft_p99_seconds", "itl_p99_seconds"))
    return {"requests_per_s": 1.0, "prompt_tokens_mean": 128, "output_tokens_mean": 32, "ttft_p99_ms": ttft_ms,
            "itl_p99_ms": itl_ms, "itl_max_ms": max(ITL_SLIDER_MAX_MS, math.ceil(2 * itl_ms / 100) * 100)}


@viewer_required
def capacity_page(request, name: str):
    deployment = get_deployment_or_404(name)
    pools = list(deployment.pools.order_by("role"))
    return page(request, "dashboards/capacity.html", {
        **profiles_context(deployment), "job": profile_job_latest(deployment), "pools": pools,
        "schedules": schedule_rows(pools),
        "defaults": plan_defaults(deployment),
    })


@viewer_required
def capacity_profiles(request, name: str):
    """The profile section alone (HTML fragment), fetched when a profile run finishes."""
    deployment = get_deployment_or_404(name)
    return page(request, "dashboards/_capacity_profiles.html", profiles_context(deployment))
