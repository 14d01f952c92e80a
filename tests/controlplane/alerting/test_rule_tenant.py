"""A rule may target a tenant: it reads that tenant's series (one alert instance per deployment it uses, labelled
with the tenant), so a tenant at 90 % of its tokens-per-minute quota fires for that tenant and not for another one
at the same level; bad scopes are 400s that name the field."""
import pytest

from controlplane.observability.catalog import METRIC_IDS

BASE = {"name": "acme-quota", "deployment": "demo", "tenant": "acme", "metric": "tokens_per_minute_quota_ratio",
        "aggregation": "max", "comparison": ">=", "threshold": 0.9}


@pytest.fixture
def tenants(db):
    from controlplane.tenants.models import Tenant

    return [Tenant.objects.create(name="acme", tokens_per_minute=6000),
            Tenant.objects.create(name="beta", tokens_per_minute=6000)]


def write_tenant_sample(deployment, tenant: str, metric: str, value: float, when):
    from controlplane.observability.models import TenantSample

    TenantSample.objects.create(ts=when.timestamp(), deployment_id=deployment.pk, tenant=tenant,
                                metric=METRIC_IDS[metric], value=value)


def test_a_rule_targeting_a_tenant_fires_for_it_and_not_for_another_tenant(quiet_deployment, tenants, make_rule,
                                                                           evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, name="acme-quota", role="", tenant="acme",
                     metric="tokens_per_minute_quota_ratio", aggregation="max", comparison=">=", threshold=0.9)
    # beta runs at its quota, acme well below: nothing fires (the rule reads acme's series only).
    write_tenant_sample(quiet_deployment, "beta", "tokens_per_minute_quota_ratio", 0.97, at(0))
    write_tenant_sample(quiet_deployment, "acme", "tokens_per_minute_quota_ratio", 0.4, at(0))
    evaluate(at(0))
    assert not Alert.objects.exists()
    write_tenant_sample(quiet_deployment, "acme", "tokens_per_minute_quota_ratio", 0.93, at(10))
    evaluate(at(10))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == "firing" and alert.value == pytest.approx(0.93)
    assert alert.labels["tenant"] == "acme" and alert.labels["deployment"] == quiet_deployment.name
    assert rule.describe() == 'max(tokens_per_minute_quota_ratio{tenant="acme"}[60s]) >= 0.9'
    # acme goes quiet (no series in the window): the alert resolves, though beta still runs at its quota.
    write_tenant_sample(quiet_deployment, "beta", "tokens_per_minute_quota_ratio", 0.99, at(100))
    evaluate(at(100))
    assert Alert.objects.get(rule=rule).state == "resolved"


def test_a_tenants_error_ratio_rule_reads_its_error_ratio_not_the_pools(quiet_deployment, tenants, make_rule,
                                                                        write_sample, evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, name="beta-errors", role="gateway", tenant="beta", metric="error_ratio",
                     aggregation="avg", comparison=">", threshold=0.05)
    write_sample(quiet_deployment, "gateway", "error_ratio", 0.5, at(0))  # the whole gateway: not beta's
    write_tenant_sample(quiet_deployment, "acme", "error_ratio", 0.5, at(0))
    write_tenant_sample(quiet_deployment, "beta", "error_ratio", 0.01, at(0))
    evaluate(at(0))
    assert not Alert.objects.exists()
    write_tenant_sample(quiet_deployment, "beta", "error_ratio", 0.2, at(5))
    evaluate(at(5))
    assert Alert.objects.get(rule=rule).labels["tenant"] == "beta"


@pytest.mark.parametrize("change, field, words", [
    ({"tenant": "nobody"}, "tenant", "no tenant named 'nobody'"),
    ({"tenant": ""}, "tenant", "exists per tenant only"),
    ({"metric": "kv_cache_usage_ratio"}, "metric", "not stored per tenant"),
    ({"role": "decode"}, "role", "role must be gateway or empty"),
    ({"per_worker": True}, "per_worker", "not per worker"),
    ({"fire_on_no_data": True}, "fire_on_no_data", "cannot fire on no data"),
    ({"role": "", "actions": [{"type": "scale"}]}, "actions[0].type", "may only notify"),
    ({"labels": {"tenant": "beta"}}, "labels", "may not set"),
])
def test_it_refuses_a_bad_tenant_scope_naming_the_field(quiet_deployment, tenants, admin_api, change, field, words):
    response = admin_api.post("/api/v1/alert-rules/", {**BASE, **change}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert words in error["message"]
    assert error.get("field") == field or field in error.get("fields", {})


def test_a_tenant_rule_is_created_listed_and_exported(quiet_deployment, tenants, admin_api):
    response = admin_api.post("/api/v1/alert-rules/", BASE, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == "acme"
    assert response.json()["condition"] == 'max(tokens_per_minute_quota_ratio{tenant="acme"}[60s]) >= 0.9'
    # A partial update keeps the tenant; moving it to a metric not stored per tenant is refused.
    rule_id = response.json()["id"]
    assert admin_api.patch(f"/api/v1/alert-rules/{rule_id}/", {"threshold": 0.8},
                           format="json").json()["tenant"] == "acme"
    assert admin_api.patch(f"/api/v1/alert-rules/{rule_id}/", {"metric": "itl_p99_seconds"},
                           format="json").status_code == 400
    export = admin_api.get("/api/v1/alert-rules/export?format=prometheus").content.decode()
    assert ('max_over_time(tandem_tenant:tokens_per_minute_quota_ratio{tenant=\\"acme\\", '
            'deployment=\\"demo\\"}[60s]) >= 0.8') in export
