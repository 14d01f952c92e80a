"""The what-if page: a window of one of the deployment's traces replayed on the deployment as it stands and as the
form's change would make it (controlplane.replay.whatif, the same call as `POST .../what-if`), side by side: the
verdict against the attainment target, the figures, the two fleets, and charts of the two timelines.

Viewers may run it: a what-if changes nothing. A refusal (a bad field, no profile, an empty window, no such trace)
is the page again with the what-if's message and its status, never a 500."""
from __future__ import annotations

import json

from django.views.decorators.http import require_http_methods

from controlplane.errors import ControlPlaneError
from controlplane.replay.models import RECORDED
from controlplane.replay.selectors import trace_get, trace_list
from controlplane.replay.whatif import ROUTINGS, fleet_of, what_if
from dashboards.access import viewer_required
from dashboards.views.common import page
from dashboards.views.pages import get_deployment_or_404
from dashboards.what_if import (change_from_form, figure_rows, fleet_rows, timeline_figures, verdict_texts,
                                window_from_form)


def _traces(deployment) -> list[dict]:
    """The deployment's traces for the form's select, the recorded one first (it exists once its gateways record;
    until then it is listed empty, as `trace_get` answers for it)."""
    traces = trace_list(deployment)
    recorded = [t for t in traces if t["name"] == RECORDED] or [{"name": RECORDED, "requests": 0, "duration_s": 0.0}]
    return recorded + [t for t in traces if t["name"] != RECORDED]


@viewer_required
@require_http_methods(["GET", "POST"])
def what_if_page(request, name: str):
    deployment = get_deployment_or_404(name)
    current = fleet_of(deployment).describe()
    form = request.POST if request.method == "POST" else {}
    context = {"deployment": deployment, "traces": _traces(deployment), "current": current, "routings": ROUTINGS,
               "form": {"trace": form.get("trace") or RECORDED, "since": form.get("since", ""),
                        "until": form.get("until", ""),
                        "replicas": [(role, replicas, current["bounds"][role],
                                      form.get(f"replicas_{role}", replicas))
                                     for role, replicas in current["replicas"].items()],
                        "autoscale": form.get("autoscale") or ("on" if current["autoscale"] else "off"),
                        "max_queued": form.get("max_queued", current["admission"]["max_queued"]),
                        "prefix_caching": form.get("prefix_caching") or ("on" if current["prefix_caching"]
                                                                         else "off"),
                        "routing": form.get("routing") or current["routing"],
                        "traffic_rate": form.get("traffic_rate", f"{current['traffic_rate']:g}")}}
    if request.method != "POST":
        return page(request, "dashboards/what_if.html", context)
    try:
        trace, since_s, until_s = window_from_form(form)
        change = change_from_form(form, current)
        context["request_json"] = json.dumps({"trace": trace, "since": since_s, "until": until_s, "change": change})
        report = what_if(deployment, trace_get(deployment, trace), change=change, since_s=since_s, until_s=until_s)
    except ControlPlaneError as error:
        context["error"] = error.message
        return page(request, "dashboards/what_if.html", context, status=error.status)
    context.update(report=report, verdict=verdict_texts(report), rows=figure_rows(report),
                   fleet_rows=fleet_rows(report["fleet"]["before"], report["fleet"]["after"]),
                   figures=timeline_figures(report))
    return page(request, "dashboards/what_if.html", context)
