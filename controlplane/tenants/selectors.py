"""Reads of tenants shared by the API, the pages and the endpoints answer (through controlplane.tenant_provider)."""
from __future__ import annotations

from django.db.models import Exists, JSONField, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from controlplane.errors import not_found
from controlplane.models import Deployment
from controlplane.tenants.models import DeploymentAccess, Tenant, TenantKey

MAX_ID = 2**63 - 1


def tenant_list() -> QuerySet[Tenant]:
    return Tenant.objects.prefetch_related("deployments")


def tenant_get(name: str) -> Tenant:
    tenant = tenant_list().filter(name=name).first() if isinstance(name, str) and len(name) <= 63 else None
    if tenant is None:
        raise not_found(f"tenant {name!r} does not exist")
    return tenant


def tenant_key_list(tenant: Tenant) -> QuerySet[TenantKey]:
    return TenantKey.objects.filter(tenant=tenant).select_related("created_by")


def tenant_key_get(tenant: Tenant, key_id: int) -> TenantKey:
    key = tenant_key_list(tenant).filter(pk=key_id).first() if 0 < key_id <= MAX_ID else None
    if key is None:
        raise not_found(f"tenant {tenant.name!r} has no key {key_id}")
    return key


def deployment_requires_key(deployment) -> bool:
    """Open (False) unless an admin marked the deployment as requiring a key."""
    return DeploymentAccess.objects.filter(deployment=deployment, requires_key=True).exists()


def deployment_admission(deployment) -> dict:
    """The admission settings an admin set for the deployment ({}: none, its gateways' flags apply)."""
    return dict(DeploymentAccess.objects.filter(deployment=deployment).values_list("admission", flat=True).first()
                or {})


def active_keys(now=None) -> QuerySet[TenantKey]:
    now = now or timezone.now()
    return TenantKey.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def gateway_access(deployment) -> dict:
    """What the deployment's gateways enforce (docs/contracts.md, "Tenants"): `requires_key`, and under `tenants`
    every tenant with an active key: its class, limits, whether it may use this deployment (`allowed`: a key of a
    tenant that may not gets 404 model_not_found rather than 401), and its keys' hashes with their expiry (the
    gateway checks it between polls). Never a key itself. Nothing (an open deployment, as the core says without
    this app) when the deployment is open and no tenant has a key. `admission`: the deployment's admission settings,
    when an admin set any (the gateways' flags say what they leave out)."""
    return gateway_access_many([deployment])[deployment.pk]


def gateway_access_many(deployments) -> dict[int, dict]:
    """gateway_access of each deployment, by id, in as many queries as for one: a shared gateway's one poll reads
    every deployment it serves (one query in the common case, open and no keys; three otherwise)."""
    ids = [deployment.pk for deployment in deployments]
    admission = Subquery(DeploymentAccess.objects.filter(deployment=OuterRef("pk")).values("admission")[:1],
                         output_field=JSONField())
    rows = (Deployment.objects.filter(pk__in=ids)
            .annotate(requires_key=Exists(DeploymentAccess.objects.filter(deployment=OuterRef("pk"),
                                                                          requires_key=True)),
                      has_keys=Exists(active_keys()), admission_set=admission)
            .values_list("pk", "requires_key", "has_keys", "admission_set"))
    answers, keyed = {pk: {} for pk in ids}, {}
    for pk, requires_key, has_keys, admission_set in rows:
        if admission_set:
            answers[pk]["admission"] = dict(admission_set)
        if requires_key or has_keys:
            keyed[pk] = requires_key
    if not keyed:
        return answers
    keys = list(active_keys().select_related("tenant").order_by("tenant__name", "id"))
    may_use = set(Tenant.deployments.through.objects.filter(deployment_id__in=list(keyed),
                                                            tenant_id__in={key.tenant_id for key in keys})
                  .values_list("tenant_id", "deployment_id"))
    for pk, requires_key in keyed.items():
        tenants: dict[str, dict] = {}
        for key in keys:
            tenant = key.tenant
            entry = tenants.setdefault(tenant.name, {"class": tenant.priority_class, "limits": tenant.limits,
                                                     "allowed": (tenant.pk, pk) in may_use, "keys": []})
            entry["keys"].append({"hash": key.key_hash,
                                  "expires_at": key.expires_at.timestamp() if key.expires_at is not None else None})
        answers[pk] = {"requires_key": requires_key, "tenants": tenants, **answers[pk]}
    return answers
