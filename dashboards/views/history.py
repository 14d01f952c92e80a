"""The audit log (actions) and a deployment's revision history."""
from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator

from controlplane.models import ActionKind, ActionStatus, ActorType
from controlplane.revision_diff import revision_diff
from controlplane.selectors import action_list, revision_list
from dashboards.access import viewer_required
from dashboards.selectors import action_deployment_names, running_revisions
from dashboards.views.common import page
from dashboards.views.pages import get_deployment_or_404

PAGE_SIZE = 50


def _choice(raw, allowed) -> str:
    return raw if raw in allowed else ""


@viewer_required
def actions_page(request):
    """Filterable by deployment, actor (a username, rule name, ...), actor type, kind and status."""
    filters = {
        "deployment": (request.GET.get("deployment") or "").strip()[:63],
        "actor": (request.GET.get("actor") or "").strip()[:150],
        "actor_type": _choice(request.GET.get("actor_type"), ActorType.values),
        "kind": _choice(request.GET.get("kind"), ActionKind.values),
        "status": _choice(request.GET.get("status"), ActionStatus.values),
    }
    actions = action_list(**{key: value or None for key, value in filters.items()}).select_related("worker")
    paginator = Paginator(actions, PAGE_SIZE)
    page_obj = paginator.get_page(request.GET.get("page"))
    query = urlencode({key: value for key, value in filters.items() if value})
    return page(request, "dashboards/actions.html", {
        "page_obj": page_obj, "filters": filters, "query": query,
        "deployments": action_deployment_names(),
        "kinds": ActionKind.values, "actor_types": ActorType.values, "statuses": ActionStatus.values,
    })


def _number(raw) -> int | None:
    return int(raw) if raw and raw.isdigit() and len(raw) < 10 else None


@viewer_required
def revisions_page(request, name: str):
    """The history, which revision is current and which ones workers run now, and the diff of two of them
    (?a=&b=; by default the previous revision against the current one)."""
    deployment = get_deployment_or_404(name)
    revisions = list(revision_list(deployment))  # newest first
    running = running_revisions(deployment)
    by_number = {r.number: r for r in revisions}
    current = deployment.current_revision
    a, b = _number(request.GET.get("a")), _number(request.GET.get("b"))
    if b not in by_number:
        b = current.number if current else (revisions[0].number if revisions else None)
    if a not in by_number:
        # The previous revision; after a rollback to the oldest one, the newest other one (what was rolled back).
        others = [n for n in by_number if b is not None and n != b]
        a = max((n for n in others if n < b), default=max(others, default=None))
    diff = revision_diff(by_number[a], by_number[b]) if a in by_number and b in by_number else None
    for revision in revisions:
        revision.num_running = running.get(revision.number, 0)
    return page(request, "dashboards/revisions.html", {
        "deployment": deployment, "revisions": revisions, "current": current, "a": a, "b": b, "diff": diff,
    })
