"""The capacity page: the current revision's profiles as plots, profile runs with progress, and the planner with
what-if sliders and Apply. The page reads and writes through the REST API (session auth), like any client."""
from __future__ import annotations

from controlplane.capacity.models import Profile, ProfileJob
from controlplane.capacity.scheduling import schedules_view
from dashboards.access import viewer_required
from dashboards.views.common import page
from dashboards.views.pages import get_deployment_or_404


def profile_figures(profiles) -> dict:
    """{"prefill": [traces], "decode": [traces]} for plotly: synthetic and live points apart, and the fitted curve."""
    figures = {"prefill": [], "decode": []}
    for profile in profiles:
        points = profile.points or {}
        fits = profile.fits or {}
        label = f"{profile.role} · {profile.node_class}"
        prefill = points.get("prefill") or []
        for source in ("synthetic", "live"):
            chosen = [p for p in prefill if p.get("source", "synthetic") == source]
            if chosen:
                figures["prefill"].append({"type": "scatter", "mode": "markers", "name": f"{label} {source}",
                                           "x": [p["batch_tokens"] for p in chosen],
                                           "y": [p["latency_s"] * 1000 for p in chosen],
                                           "marker": {"symbol": "circle" if source == "synthetic" else "diamond"}})
        if "prefill" in fits and prefill:
            f = fits["prefill"]
            top = max(p["batch_tokens"] for p in prefill)
            xs = [round(top * i / 20) for i in range(21)]
            # One prompt of x tokens (a batch of shorter prompts costs less: attention is per prompt).
            figures["prefill"].append({"type": "scatter", "mode": "lines", "name": f"{label} fit, one prompt",
                                       "x": xs, "y": [(f["a"] + f["b"] * x + f["c"] * x * x) * 1000 for x in xs]})
        decode = points.get("decode") or []
        for source in ("synthetic", "live"):
            chosen = [p for p in decode if p.get("source", "synthetic") == source]
            if chosen:
                figures["decode"].append({"type": "scatter", "mode": "markers", "name": f"{label} {source}",
                                          "x": [p["batch"] for p in chosen], "y": [p["step_s"] * 1000 for p in chosen],
                                          "text": [f"context {p['context']}" for p in chosen],
                                          "marker": {"symbol": "circle" if source == "synthetic" else "diamond"}})
        if "decode" in fits and decode:
            f = fits["decode"]
            top = max(p["batch"] for p in decode)
            for context in sorted({p["context"] for p in decode if p.get("source") != "live"}):
                xs = [1 + (top - 1) * i / 10 for i in range(11)]
                figures["decode"].append({"type": "scatter", "mode": "lines", "name": f"{label} fit, context {context}",
                                          "x": xs, "y": [(f["a"] + f["b"] * x + f["c"] * x * context) * 1000
                                                         for x in xs]})
    return figures


@viewer_required
def capacity_page(request, name: str):
    deployment = get_deployment_or_404(name)
    profiles = list(Profile.objects.filter(revision=deployment.current_revision_id).order_by("role"))
    job = ProfileJob.objects.filter(deployment=deployment).order_by("-created_at").first()
    pools = list(deployment.pools.order_by("role"))
    schedules = [row for pool in pools for row in schedules_view(pool)]
    return page(request, "dashboards/capacity.html", {
        "deployment": deployment, "profiles": profiles, "job": job, "pools": pools, "schedules": schedules,
        "figures": profile_figures(profiles),
        "defaults": {"requests_per_s": 1.0, "prompt_tokens_mean": 128, "output_tokens_mean": 32,
                     "ttft_p99_ms": 1000, "itl_p99_ms": 200},
    })
