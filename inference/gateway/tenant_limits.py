"""The limits a tenant may have, declared once: each one's name, meaning, bound and how the gateway keeps it.

Every limit is optional (absent or null: no limit) and a whole number from 1 to its `high`. From this table the
control plane builds the Tenant model's columns (controlplane/tenants/models.py), checks a tenant's `limits`
(controlplane/tenants/services.py) and writes the API's help; the gateway takes the limits it knows from its
membership answer (tenant_policy.py), keeps a token bucket for each per-minute one (tenant_quota.py), carries the
buckets across a restart (quota_state.py) and exports the metered ones per tenant (tenant_metrics.py). Pure: the
control plane imports it, and it imports nothing of either process.

Adding a limit: a row here, its check in tenant_quota.admit (what the request counts against it, and what it answers
when over), and the migration `makemigrations` writes for its column.
"""
from __future__ import annotations

from dataclasses import dataclass

# The largest limit a 32-bit column holds; far beyond any real rate.
MAX_LIMIT = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TenantLimit:
    name: str
    help: str
    # A per-minute limit: the name of its token bucket (TenantState.buckets), which is also its key in the
    # quota-state file, so a rename would lose every tenant's minute across the restart that brings it.
    bucket: str = ""
    # It meters a flow (a rate, requests in flight) rather than capping one request: the gateway exports it and its
    # 429s per tenant, so the control plane can say how close a tenant runs to it.
    metered: bool = True
    high: int = MAX_LIMIT
    # The control plane keeps it in a 64-bit column: tokens outgrow a 32-bit count long before requests do, and
    # widening a column later is a migration of every tenant row.
    wide: bool = False


# In the order the API and the control plane's messages list them.
TENANT_LIMITS = (
    TenantLimit("requests_per_minute", "requests admitted a minute", bucket="requests"),
    TenantLimit("tokens_per_minute", "prompt + completion tokens a minute", bucket="tokens", wide=True),
    TenantLimit("max_concurrent_requests", "requests in flight at once"),
    TenantLimit("max_tokens", "the most completion tokens one request may ask for, and what one that asks for none "
                "gets", metered=False),
)
BY_NAME = {limit.name: limit for limit in TENANT_LIMITS}
NAMES = tuple(BY_NAME)
METERED = tuple(limit.name for limit in TENANT_LIMITS if limit.metered)
BUCKET_LIMITS = tuple(limit for limit in TENANT_LIMITS if limit.bucket)
BUCKETS = tuple(limit.bucket for limit in BUCKET_LIMITS)
