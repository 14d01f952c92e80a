"""Each tenant limit declared once (inference/gateway/tenant_limits.py) reaches every place of the gateway that reads
limits: the membership keeps it, a per-minute one gets the bucket the table names (the quota-state file's key), and a
metered one is exported per tenant."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from inference.gateway import quota_state
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_limits import BUCKETS, METERED, NAMES, TENANT_LIMITS
from inference.gateway.tenant_policy import parse_tenancy


def _gate() -> TenantGate:
    limits = {name: 10 + i for i, name in enumerate(NAMES)}
    policy = parse_tenancy({"tenants": {"acme": {"class": "standard", "limits": limits, "allowed": True}}})
    return TenantGate(lambda: policy, clock=lambda: 100.0)


def test_every_declared_limit_is_kept_from_the_membership_and_a_per_minute_one_gets_its_bucket():
    gate = _gate()
    gate.sync()
    state = gate.states["acme"]
    assert set(state.policy.limits) == set(NAMES)
    assert sorted(state.buckets) == sorted(BUCKETS)
    for limit in TENANT_LIMITS:
        if limit.bucket:
            assert state.buckets[limit.bucket].per_minute == state.policy.limits[limit.name]
    assert set(quota_state.snapshot(gate, wall=0.0)["tenants"]["acme"]) == set(BUCKETS)


def test_the_metered_limits_and_only_they_are_exported_per_tenant():
    gate = _gate()
    gate.sync()
    registry = CollectorRegistry()
    registry.register(gate.collector("m"))
    labels = {"role": "gateway", "model": "m", "tenant": "acme"}
    exported = {limit.name for limit in TENANT_LIMITS
                if registry.get_sample_value("tandem_gateway_tenant_limit", {**labels, "limit": limit.name})}
    assert exported == set(METERED) and "max_tokens" not in exported
