"""Writes of tenants, their keys and the deployments' key requirement: one service per verb, each recording one
Action row (controlplane.services.actions) in the same transaction as its change.

Every bad value is a 400 naming its field (`priority_class`, `limits.tokens_per_minute`, `deployments`,
`expires_at`), so the API, the pages and any other caller refuse alike."""
from __future__ import annotations

import secrets
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.errors import ControlPlaneError, invalid
from controlplane.models import ActionKind, ActionStatus, Deployment
from controlplane.services.actions import Actor, action_create, action_once, as_actor
from controlplane.services.tokens import key_hash
from controlplane.services.validation import NAME_RE
from controlplane.tenants.models import PRICE_FIELDS, DeploymentAccess, PriorityClass, Tenant, TenantKey, TenantUsage
from inference.gateway import tenant_limits
from inference.gateway.admission_settings import AdmissionSettingsError, check_admission_settings

# The audit rows' kind. Every tenant change is one kind, told apart by params["verb"] (create, update, delete,
# key_issue, key_revoke, access, admission).
TENANT_ACTION = ActionKind.TENANT
MAX_PRICE = 1_000_000  # per 1M tokens
KEY_PREFIX = "tk-"
UNSET = object()


def _record(params: dict, *, actor, reason: str, idempotency_key: str | None, deployment=None):
    """The audit row of a change done in the caller's transaction: finished when it is written."""
    return action_create(kind=TENANT_ACTION, actor=actor, deployment=deployment, reason=reason, params=params,
                         status=ActionStatus.SUCCEEDED, idempotency_key=idempotency_key)


def check_priority_class(value) -> str:
    if value not in PriorityClass.values:
        raise invalid(f"priority_class must be one of {', '.join(PriorityClass.values)}, not {value!r}",
                      field="priority_class")
    return value


def check_limits(limits) -> dict[str, int | None]:
    """{limit: positive integer, or None for no limit}; an unknown limit (inference/gateway/tenant_limits.py), 0, a
    negative, a non-integer or one above the limit's bound is a 400 naming `limits.<name>`."""
    if limits is None:
        return {}
    names = ", ".join(tenant_limits.NAMES)
    if not isinstance(limits, dict):
        raise invalid(f"limits must be an object of {names}, not {limits!r}", field="limits")
    checked = {}
    for name, value in limits.items():
        limit = tenant_limits.BY_NAME.get(name)
        if limit is None:
            raise invalid(f"limits.{name} is not a limit; the limits are {names}", field=f"limits.{name}")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not
                                  0 < value <= limit.high):
            raise invalid(f"limits.{name} must be a whole number from 1 to {limit.high} (null or left out: no "
                          f"limit), not {value!r}", field=f"limits.{name}")
        checked[name] = value
    return checked


def check_prices(prices) -> dict[str, Decimal | None]:
    """{model field: price per 1M tokens, or None for not priced} from {"prompt": ..., "completion": ...}; an unknown
    kind, a negative, a non-number or more than 6 decimals is a 400 naming `prices.<kind>`."""
    if prices is None:
        return {}
    if not isinstance(prices, dict):
        raise invalid(f"prices must be an object of {', '.join(PRICE_FIELDS)}, not {prices!r}", field="prices")
    checked = {}
    for kind, value in prices.items():
        if kind not in PRICE_FIELDS:
            raise invalid(f"prices.{kind} is not a price; the prices are {', '.join(PRICE_FIELDS)} (per 1M tokens)",
                          field=f"prices.{kind}")
        price = None
        if value is not None:
            try:
                price = Decimal(str(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            except InvalidOperation:
                price = None
            if price is None or not price.is_finite() or not 0 <= price <= MAX_PRICE or price != round(price, 6):
                raise invalid(f"prices.{kind} must be a number from 0 to {MAX_PRICE} per 1M tokens with at most 6 "
                              f"decimals (null: not priced), not {value!r}", field=f"prices.{kind}")
        checked[PRICE_FIELDS[kind]] = price
    return checked


def _check_name(name) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid("a tenant name is 1-63 lowercase letters, digits and dashes, starting and ending with a "
                      f"letter or digit, not {name!r}", field="name")
    return name


def _deployments(names) -> list[Deployment]:
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise invalid(f"deployments must be a list of deployment names, not {names!r}", field="deployments")
    found = {d.name: d for d in Deployment.objects.filter(name__in=set(names))}
    missing = sorted(set(names) - set(found))
    if missing:
        raise invalid(f"deployments: no deployment named {missing[0]!r}", field="deployments")
    return [found[name] for name in sorted(found)]


def tenant_create(*, name: str, priority_class: str = PriorityClass.STANDARD, limits: dict | None = None,
                  deployments: list[str] = (), prices: dict | None = None, actor, reason: str = "",
                  idempotency_key: str | None = None) -> Tenant:
    """A new tenant (no keys yet: tenant_key_issue). 409 when the name is taken."""
    _check_name(name)
    check_priority_class(priority_class)
    limits = check_limits(limits)
    priced = check_prices(prices)
    targets = _deployments(list(deployments))
    params = {"verb": "create", "tenant": name, "priority_class": priority_class, "limits": limits,
              "deployments": [d.name for d in targets]}
    if priced:
        params["prices"] = _price_params(priced)

    def write():
        if Tenant.objects.filter(name=name).exists():
            raise ControlPlaneError(f"tenant {name!r} already exists", status=409, extra={"field": "name"})
        if Tenant.objects.count() >= settings.TANDEM_MAX_TENANTS:
            raise ControlPlaneError(f"there are {settings.TANDEM_MAX_TENANTS} tenants already, the most this control "
                                    "plane keeps (TANDEM_MAX_TENANTS: each is a label value on every gateway's "
                                    "metrics); delete one first", status=409, extra={"field": "name"})
        tenant = Tenant.objects.create(name=name, priority_class=priority_class, **limits, **priced)
        tenant.deployments.set(targets)
        return _record(params, actor=actor, reason=reason, idempotency_key=idempotency_key)

    action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write, request=params)
    return Tenant.objects.get(name=name)


def _price_params(priced: dict) -> dict:
    """The audit row's prices (JSON: a Decimal as its text)."""
    kinds = {field: kind for kind, field in PRICE_FIELDS.items()}
    return {kinds[field]: None if price is None else str(price) for field, price in priced.items()}


def tenant_update(*, tenant: Tenant, actor, reason: str = "", idempotency_key: str | None = None,
                  priority_class=UNSET, limits=UNSET, deployments=UNSET, prices=UNSET) -> Tenant:
    """Change what is given: the class, the limits named in `limits` (null removes one; the others stay) and the
    whole list of deployments. The gateways apply it at their next membership poll."""
    changes: dict = {}
    if priority_class is not UNSET:
        changes["priority_class"] = check_priority_class(priority_class)
    if limits is not UNSET:
        changes.update(check_limits(limits))
    priced = check_prices(prices) if prices is not UNSET else {}
    targets = _deployments(deployments) if deployments is not UNSET else None
    params = {"verb": "update", "tenant": tenant.name, **changes}
    if priced:
        params["prices"] = _price_params(priced)
        changes.update(priced)
    if targets is not None:
        params["deployments"] = [d.name for d in targets]

    def write():
        with transaction.atomic():
            Tenant.objects.filter(pk=tenant.pk).update(updated_at=timezone.now(), **changes)
            if targets is not None:
                tenant.deployments.set(targets)
            return _record(params, actor=actor, reason=reason, idempotency_key=idempotency_key)

    action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write, request=params)
    return Tenant.objects.prefetch_related("deployments").get(pk=tenant.pk)


def tenant_service_key(tenant_name: str, deployment_name: str) -> str:
    """A new key of tenant `tenant_name` for a client of the control plane's own (make run's demo load), the tenant
    created, or given access to `deployment_name`, where needed: the client is then one tenant among others,
    counted and billed as one."""
    actor = Actor.system("tandem_run")
    tenant = Tenant.objects.filter(name=tenant_name).first()
    if tenant is None:
        tenant = tenant_create(name=tenant_name, deployments=[deployment_name], actor=actor,
                               reason=f"a key of its own for a client of {deployment_name}, which requires one")
    elif not tenant.deployments.filter(name=deployment_name).exists():
        names = [*tenant.deployments.values_list("name", flat=True), deployment_name]
        tenant = tenant_update(tenant=tenant, deployments=names, actor=actor,
                               reason=f"its client sends requests to {deployment_name}")
    _, key = tenant_key_issue(tenant=tenant, name=f"{tenant_name} client", actor=actor,
                              reason=f"a key for a client of {deployment_name}")
    return key


def retired_name(name: str, tenant_id: int) -> str:
    """What a deleted tenant's usage is kept under: its name and id, `acme~17` (no tenant name has a `~`), so that a
    new tenant of the same name starts with none of it."""
    suffix = f"~{tenant_id}"
    return name[:63 - len(suffix)] + suffix


def tenant_delete(*, tenant: Tenant, actor, reason: str = "", idempotency_key: str | None = None) -> None:
    """The tenant and its keys go; its keys stop working on every gateway at its next poll. Its usage rows stay (a
    bill), renamed to `retired_name`: usage belongs to the tenant, not to its name."""
    usage_as = retired_name(tenant.name, tenant.pk)
    params = {"verb": "delete", "tenant": tenant.name, "usage_as": usage_as,
              "num_keys": TenantKey.objects.filter(tenant=tenant).count()}

    def write():
        Tenant.objects.filter(pk=tenant.pk).delete()
        TenantUsage.objects.filter(tenant=tenant.name).update(tenant=usage_as)
        return _record(params, actor=actor, reason=reason, idempotency_key=idempotency_key)

    action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write,
                request={"verb": "delete", "tenant": tenant.name})


def _check_expiry(expires_at) -> datetime | None:
    if expires_at is None:
        return None
    if not isinstance(expires_at, datetime):
        raise invalid(f"expires_at must be a date and time, not {expires_at!r}", field="expires_at")
    if timezone.is_naive(expires_at):
        raise invalid("expires_at must carry a time zone (e.g. 2027-01-01T00:00:00Z)", field="expires_at")
    if expires_at <= timezone.now():
        raise invalid(f"expires_at {expires_at.isoformat()} is in the past", field="expires_at")
    return expires_at


def tenant_key_issue(*, tenant: Tenant, name: str = "", expires_at: datetime | None = None, actor,
                     reason: str = "", idempotency_key: str | None = None) -> tuple[TenantKey, str]:
    """A new key for the tenant: (its row, the key). The key is returned this once and stored as its SHA-256.
    A repeated idempotency key is a 409 (the key it issued cannot be shown again: revoke it and issue another)."""
    expires_at = _check_expiry(expires_at)
    if not isinstance(name, str) or len(name) > 100:
        raise invalid("a key's name is at most 100 characters", field="name")
    issued: list[tuple[TenantKey, str]] = []
    params = {"verb": "key_issue", "tenant": tenant.name, "name": name,
              "expires_at": expires_at.isoformat() if expires_at else None}

    def write():
        key = KEY_PREFIX + secrets.token_urlsafe(30)  # 240 random bits
        row = TenantKey.objects.create(tenant=tenant, name=name, key_hash=key_hash(key), prefix=key[:10],
                                       expires_at=expires_at, created_by=as_actor(actor).user)
        issued.append((row, key))
        return _record({**params, "key_id": row.pk, "prefix": row.prefix}, actor=actor, reason=reason,
                       idempotency_key=idempotency_key)

    earlier = action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write, request=params)
    if not issued:
        raise ControlPlaneError("a key was already issued under this idempotency key (key "
                                f"{earlier.params.get('key_id')}); a key is shown only once: revoke it and issue "
                                "another", status=409, extra={"key_id": earlier.params.get("key_id")})
    return issued[0]


def tenant_key_revoke(*, key: TenantKey, actor, reason: str = "", idempotency_key: str | None = None) -> TenantKey:
    """The key stops working on every gateway at its next poll; its row stays (revoked_at set) for the record.
    Revoking a revoked key changes nothing and records nothing."""
    params = {"verb": "key_revoke", "tenant": key.tenant.name, "key_id": key.pk, "prefix": key.prefix}

    def write():
        TenantKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        return _record(params, actor=actor, reason=reason, idempotency_key=idempotency_key)

    if key.revoked_at is None:
        action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write, request=params)
    return TenantKey.objects.select_related("tenant", "created_by").get(pk=key.pk)


def deployment_admission_set(*, deployment: Deployment, admission: dict | None, actor, reason: str = "",
                             idempotency_key: str | None = None) -> dict:
    """Set the deployment's admission settings (None or {}: none, its gateways' flags apply); its gateways follow at
    their next poll. A bad value is a 400 naming `admission.<field>`."""
    try:
        admission = check_admission_settings({} if admission is None else admission)
    except AdmissionSettingsError as exc:
        field = "admission" if exc.param == "admission" else f"admission.{exc.param}"
        raise invalid(f"{field} {exc.requirement}", field=field) from None
    _access_update(deployment, {"admission": admission}, {"verb": "admission", "admission": admission},
                   actor=actor, reason=reason, idempotency_key=idempotency_key)
    return admission


def deployment_access_set(*, deployment: Deployment, requires_key: bool, actor, reason: str = "",
                          idempotency_key: str | None = None) -> bool:
    """Mark a deployment as requiring a tenant key, or open it again; its gateways follow at their next poll."""
    if not isinstance(requires_key, bool):
        raise invalid(f"requires_key must be true or false, not {requires_key!r}", field="requires_key")
    _access_update(deployment, {"requires_key": requires_key}, {"verb": "access", "requires_key": requires_key},
                   actor=actor, reason=reason, idempotency_key=idempotency_key)
    return requires_key


def _access_update(deployment: Deployment, fields: dict, params: dict, *, actor, reason: str,
                   idempotency_key: str | None) -> None:
    """Set `fields` of the deployment's DeploymentAccess and record the change (once per idempotency key)."""

    def write():
        DeploymentAccess.objects.update_or_create(deployment=deployment,
                                                  defaults={**fields, "updated_at": timezone.now()})
        return _record(params, actor=actor, reason=reason, idempotency_key=idempotency_key, deployment=deployment)

    action_once(kind=TENANT_ACTION, idempotency_key=idempotency_key, write=write,
                request={**params, "deployment": deployment.name})
