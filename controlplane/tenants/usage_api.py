"""GET /api/v1/tenants/{name}/usage and .../usage.csv: a tenant's hourly usage per deployment (what its gateways
counted, stored by the scrape: controlplane/tenants/usage.py) over a time range, with totals, priced at the tenant's
current prices per 1M tokens. Viewer."""
from __future__ import annotations

import csv
import io
import time
from datetime import datetime, timezone as dt_timezone
from decimal import Decimal

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework.response import Response

from controlplane.api.params import parse_time
from controlplane.api.views.base import READ_ERRORS, ApiView
from controlplane.errors import invalid
from controlplane.models import Deployment
from controlplane.tenants.models import PRICE_FIELDS, USAGE_FIELDS, Tenant, TenantUsage
from controlplane.tenants.selectors import tenant_get
from controlplane.tenants.usage import hour_of

PARAMETERS = [
    OpenApiParameter("start", str, OpenApiParameter.QUERY,
                     description="Unix seconds or ISO 8601; default: the start of the current month (UTC). The hour "
                                 "it falls in is included."),
    OpenApiParameter("end", str, OpenApiParameter.QUERY, description="Unix seconds or ISO 8601; default: now"),
    OpenApiParameter("deployment", str, OpenApiParameter.QUERY, description="one deployment's usage only"),
]
COLUMNS = ("hour", "deployment", *USAGE_FIELDS)
MILLION = Decimal(1_000_000)


def _month_start(now: float) -> float:
    day = datetime.fromtimestamp(now, tz=dt_timezone.utc)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def tenant_usage(name: str, params, *, now: float) -> dict:
    """The answer of both views. 404 for a name that is neither a tenant nor in any usage row (a deleted tenant's
    rows, and `_anonymous`'s, stay readable); 400 naming a bad parameter."""
    rows = TenantUsage.objects.filter(tenant=name) if isinstance(name, str) and len(name) <= 63 else None
    if rows is None or not rows.exists():
        tenant_get(name)  # 404 naming it, unless it is a tenant that has used nothing yet
    end = parse_time(params["end"], "end") if params.get("end") else now
    start = parse_time(params["start"], "start") if params.get("start") else _month_start(end)
    if start >= end:
        raise invalid(f"start ({start:.0f}) must be before end ({end:.0f})", field="start")
    deployment = params.get("deployment")
    if deployment is not None:
        found = Deployment.objects.filter(name=deployment).values_list("pk", flat=True).first()
        if found is None:
            raise invalid(f"deployment {deployment!r} does not exist", field="deployment")
        rows = rows.filter(deployment_id=found)
    hours = (rows.filter(hour__gte=hour_of(start), hour__lt=datetime.fromtimestamp(end, tz=dt_timezone.utc))
             .order_by("hour", "deployment__name").values_list("hour", "deployment__name", *USAGE_FIELDS))
    out = [dict(zip(COLUMNS, row)) for row in hours]
    totals = {key: sum(row[key] for row in out) for key in USAGE_FIELDS}
    prices = _prices(name)
    for row in [*out, totals]:
        row["cost"] = _cost(row, prices)
    return {"tenant": name, "deployment": deployment, "start": _iso(start), "end": _iso(end),
            "prices": {kind: float(price) for kind, price in (prices or {}).items()}, "rows": out, "totals": totals}


def _prices(name: str) -> dict[str, Decimal] | None:
    """The tenant's current prices per 1M tokens; a price it lacks counts 0. None: not priced (no price, or no
    tenant of that name)."""
    row = Tenant.objects.filter(name=name).values(*PRICE_FIELDS.values()).first() or {}
    prices = {kind: row[field] for kind, field in PRICE_FIELDS.items() if row.get(field) is not None}
    return prices or None


def _cost(row: dict, prices: dict[str, Decimal] | None) -> float | None:
    if prices is None:
        return None
    cost = sum((row[f"{kind}_tokens"] * price for kind, price in prices.items()), Decimal(0)) / MILLION
    return float(cost)  # exact to the float: 12 decimals at most (6 of a price, 6 of the million)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=dt_timezone.utc).isoformat().replace("+00:00", "Z")


def usage_csv(usage: dict) -> str:
    """One row per hour and deployment (the hour in ISO 8601, UTC), then a `total` row."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["tenant", *COLUMNS, "cost"])
    for row in usage["rows"]:
        writer.writerow([usage["tenant"], row["hour"].isoformat().replace("+00:00", "Z"),
                         *(row[key] for key in COLUMNS[1:]), _text(row["cost"])])
    totals = usage["totals"]
    writer.writerow([usage["tenant"], "total", usage["deployment"] or "", *(totals[key] for key in USAGE_FIELDS),
                     _text(totals["cost"])])
    return out.getvalue()


def _text(cost: float | None) -> str:
    return "" if cost is None else f"{Decimal(repr(cost)):f}"  # 0.0000275, not 2.75e-05


class TenantUsageView(ApiView):
    @extend_schema(parameters=PARAMETERS, responses={200: OpenApiTypes.OBJECT, **READ_ERRORS},
                   description="The tenant's usage per hour and deployment ({tenant, deployment, start, end, rows: "
                               "[{hour, deployment, " + ", ".join(USAGE_FIELDS) + ", cost}], totals, prices}) as "
                               "its gateways counted it; cost (null: not priced) at the tenant's current prices per "
                               "1M tokens. 400 naming a bad start, end or deployment. Viewer.")
    def get(self, request, name: str):
        return Response(tenant_usage(name, request.query_params, now=time.time()))


class TenantUsageCsvView(ApiView):
    @extend_schema(parameters=PARAMETERS, responses={(200, "text/csv"): str, **READ_ERRORS},
                   description="The same as CSV: one row per hour and deployment, then a total row; cost empty "
                               "when the tenant is not priced. Viewer.")
    def get(self, request, name: str):
        usage = tenant_usage(name, request.query_params, now=time.time())
        response = HttpResponse(usage_csv(usage), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{name}-usage.csv"'
        return response
