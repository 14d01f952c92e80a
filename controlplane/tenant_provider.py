"""What a deployment's gateways must know about tenants, as the core's endpoints answer carries it.

The tenants app knows which keys (by their hash) belong to which tenant, each tenant's class and limits, and whether
the deployment requires a key; it provides them (TenantsConfig.ready() calls `provide`), so that the core depends on
this seam and never imports a feature app. Until a provider is registered every deployment is open and has no
tenants: the answer carries neither `requires_key` nor `tenants` (docs/contracts.md reads their absence so).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TenantProvider:
    # deployment → the keys of the endpoints answer that concern tenants ({} when none: open, no tenants)
    gateway_access: Callable[[Any], dict]
    # deployments → gateway_access of each, by id (one poll of a shared gateway reads them all at once)
    gateway_access_many: Callable[[list], dict[int, dict]] = lambda deployments: {d.pk: {} for d in deployments}
    # deployment → its admission settings, for its page ({}: none set, the gateways' flags apply)
    admission: Callable[[Any], dict] = lambda deployment: {}
    # (tenant name, deployment name) → a new key of that tenant (created, or given access to the deployment, where
    # needed), for a client of the control plane's own (make run's demo load); None without tenants
    service_key: Callable[[str, str], str | None] = lambda tenant, deployment: None


NO_TENANTS = TenantProvider(gateway_access=lambda deployment: {})

_provider = NO_TENANTS


def provide(provider: TenantProvider) -> None:
    global _provider
    _provider = provider


def gateway_access(deployment) -> dict:
    return _provider.gateway_access(deployment)


def gateway_access_many(deployments: list) -> dict[int, dict]:
    return _provider.gateway_access_many(deployments)


def admission(deployment) -> dict:
    return _provider.admission(deployment)


def service_key(tenant: str, deployment: str) -> str | None:
    return _provider.service_key(tenant, deployment)
