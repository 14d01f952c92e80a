"""The tenants pages: the list (class, limits, keys by prefix, usage this month) and a tenant's charts of its series
per deployment (observability.tenant_series, drawn by dashboards.charts like the deployment page's) and usage.

A key is never shown: the table keeps only its hash and its first characters (`prefix`), which is what the pages
show to tell keys apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Sum
from django.utils import timezone

from controlplane.models import Deployment
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import auto_step
from controlplane.tenants.models import USAGE_FIELDS, TenantUsage
from controlplane.tenants.selectors import tenant_key_list, tenant_list
from controlplane.tenants.usage_api import tenant_usage
from dashboards.buckets import histogram_top
from dashboards.charts import Axis, Series, error_figure, line_figure
from dashboards.panels import RANGES, Line, Panel

# Tenant series are kept at raw retention only (never rolled up): no range longer than that.
TENANT_RANGES = ("15m", "1h", "6h")
DEFAULT_RANGE = "15m"
TENANT_PANELS = (
    Panel("qps", "Requests per second", "requests_per_second", (Line("qps", "req/s"),)),
    Panel("tokens", "Tokens per second", "tokens_per_second",
          (Line("prompt_tokens_per_second", "prompt"), Line("generation_tokens_per_second", "completion", "dot"))),
    Panel("errors", "Error ratio (admitted requests that did not finish)", "ratio", (Line("error_ratio", "errors"),)),
    Panel("ttft", "Time to first token", "seconds",
          (Line("ttft_p50_seconds", "P50", "dot"), Line("ttft_p99_seconds", "P99"))),
    Panel("queue_wait", "Wait in the admission queue", "seconds",
          (Line("queue_wait_p50_seconds", "P50", "dot"), Line("queue_wait_p99_seconds", "P99"))),
    Panel("quota", "Share of its per-minute limits used", "ratio",
          (Line("tokens_per_minute_quota_ratio", "tokens/min"),
           Line("requests_per_minute_quota_ratio", "requests/min", "dot"))),
)


def parse_tenant_range(raw: str | None) -> str:
    return raw if raw in TENANT_RANGES else DEFAULT_RANGE


def month_start():
    return timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class TenantRow:
    tenant: object
    keys: list  # active keys (prefix, name, expiry)
    num_inactive_keys: int
    usage: dict  # USAGE_FIELDS → this month's total


def tenant_rows() -> list[TenantRow]:
    """Every tenant with its active keys and its usage this month (UTC): three queries."""
    now = timezone.now()
    tenants = list(tenant_list().prefetch_related("keys"))
    totals = {row["tenant"]: row for row in TenantUsage.objects.filter(hour__gte=month_start())
              .values("tenant").annotate(**{key: Sum(key) for key in USAGE_FIELDS}).order_by()}
    rows = []
    for tenant in tenants:
        keys = [key for key in tenant.keys.all() if key.is_active(now)]
        usage = totals.get(tenant.name) or dict.fromkeys(USAGE_FIELDS, 0)
        rows.append(TenantRow(tenant, keys, tenant.keys.count() - len(keys),
                              {key: usage[key] for key in USAGE_FIELDS}))
    return rows


def tenant_keys(tenant) -> list:
    """The tenant's keys, newest first, each with its state (active, revoked, expired)."""
    now = timezone.now()
    keys = list(tenant_key_list(tenant).order_by("-id"))
    for key in keys:
        key.state = ("revoked" if key.revoked_at is not None else
                     "expired" if key.expires_at is not None and key.expires_at <= now else "active")
    return keys


def usage_by_deployment(name: str, *, now: float) -> dict:
    """This month's usage of the tenant per deployment, with cost at its current prices (the API's answer, summed
    over the hours): {"rows": [{deployment, *USAGE_FIELDS, cost}], "totals", "prices", "start"}."""
    usage = tenant_usage(name, {}, now=now)
    by_deployment: dict[str, dict] = {}
    for row in usage["rows"]:
        # A tenant is priced or not as a whole: every row has a cost, or none has.
        summed = by_deployment.setdefault(row["deployment"], {"deployment": row["deployment"],
                                                              **dict.fromkeys(USAGE_FIELDS, 0),
                                                              "cost": None if row["cost"] is None else 0.0})
        for key in USAGE_FIELDS:
            summed[key] += row[key]
        if row["cost"] is not None:
            summed["cost"] += row["cost"]
    return {"rows": [by_deployment[key] for key in sorted(by_deployment)], "totals": usage["totals"],
            "prices": usage["prices"], "start": usage["start"]}


def tenant_chart_figures(name: str, *, range_key: str, now: float) -> dict:
    """{"range", "start", "end", "figures": {panel key: figure}, "order", "error"}: one line per deployment (and
    quantile) of each panel, read through the metrics backend (embedded: one grouped query); a backend that does
    not answer draws every chart as its error."""
    start, end = now - RANGES[range_key], now
    step = auto_step(start, end)
    metrics = [line.metric for panel in TENANT_PANELS for line in panel.lines]
    error = None
    try:
        found = reader().tenant_range(tenant=name, metrics=metrics, start=start, end=end, step=step)
    except MetricsUnavailable as exc:
        found, error = {}, str(exc)
    names = dict(Deployment.objects.filter(pk__in={item["deployment_id"] for items in found.values()
                                                   for item in items}).values_list("id", "name"))
    reason = f"no traffic from {name} in this time range"
    figures = {}
    for panel in TENANT_PANELS:
        series = [Series(f"{line.label} {names.get(item['deployment_id'], item['deployment_id'])}".strip(),
                         item["points"], line.dash, group=str(names.get(item["deployment_id"], "")),
                         top=histogram_top(line.metric))
                  for line in panel.lines for item in found.get(line.metric, [])]
        figures[panel.key] = (error_figure(panel.title, error, x_range=(start, end)) if error else
                              line_figure(panel.title, series, Axis(panel.unit), x_range=(start, end),
                                          empty_reason=reason))
    return {"range": range_key, "start": start, "end": end, "step": step, "figures": figures,
            "order": [panel.key for panel in TENANT_PANELS], "error": error}
