"""Read-only tenant pages: the list, a tenant (keys by prefix, charts, usage) and its chart data. Viewer."""
from __future__ import annotations

import json
import time

from django.conf import settings
from django.http import Http404, HttpResponse

from controlplane.errors import ControlPlaneError
from controlplane.tenants.selectors import tenant_get
from dashboards.access import viewer_required
from dashboards.tenants import (TENANT_RANGES, parse_tenant_range, tenant_chart_figures, tenant_keys, tenant_rows,
                                usage_by_deployment)
from dashboards.views.common import page


def get_tenant_or_404(name: str):
    try:
        return tenant_get(name)
    except ControlPlaneError as error:
        raise Http404(error.message) from None


@viewer_required
def tenants_page(request):
    return page(request, "dashboards/tenants.html", {"rows": tenant_rows()})


@viewer_required
def tenant_page(request, name: str):
    tenant = get_tenant_or_404(name)
    return page(request, "dashboards/tenant.html", {
        "tenant": tenant, "keys": tenant_keys(tenant), "deployments": sorted(d.name for d in tenant.deployments.all()),
        "usage": usage_by_deployment(tenant.name, now=time.time()),
        "range_key": parse_tenant_range(request.GET.get("range")), "ranges": TENANT_RANGES,
        "retention_hours": settings.TANDEM_METRICS_RAW_RETENTION_S // 3600})


@viewer_required
def tenant_charts(request, name: str):
    """The chart figures as JSON for `Plotly.react` ({"figures", "order"}, as the deployment page's charts.json)."""
    tenant = get_tenant_or_404(name)
    figures = tenant_chart_figures(tenant.name, range_key=parse_tenant_range(request.GET.get("range")),
                                   now=time.time())
    response = HttpResponse(json.dumps(figures, separators=(",", ":")), content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response
