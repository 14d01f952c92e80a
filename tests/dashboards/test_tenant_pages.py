"""The tenants pages: the list shows each tenant's class, limits, keys by their prefix only (never a key, never its
hash) and its usage this month; a tenant's page its keys, usage per deployment with the CSV link, and charts of its
series per deployment (charts.json, drawn by the deployment page's script); the navigation links them."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from controlplane.observability.catalog import METRIC_IDS
from tests.page_assets import foreign_assets

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme(admin_api_client, deployment):
    """A tenant made through the API, with one key (the key as the API answered it once)."""
    created = admin_api_client.post("/api/v1/tenants/", {
        "name": "acme", "priority_class": "interactive", "deployments": ["demo"],
        "limits": {"tokens_per_minute": 6000}, "prices": {"prompt": 1.5, "completion": 3}}, format="json")
    assert created.status_code == 201, created.content
    key = admin_api_client.post("/api/v1/tenants/acme/keys/", {"name": "ci"}, format="json").json()
    return key


@pytest.fixture
def admin_api_client(admin):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(admin)
    return client


def test_the_list_shows_class_limits_key_prefixes_and_this_months_usage(client_for, viewer, acme, deployment):
    from controlplane.tenants.models import TenantKey, TenantUsage

    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    TenantUsage.objects.create(tenant="acme", deployment=deployment, hour=now, requests=7, prompt_tokens=700,
                               completion_tokens=70)
    html = client_for(viewer).get("/tenants/").content.decode()
    row = html[html.index('data-tenant="acme"'):]
    row = row[:row.index("</tr>")]
    assert "interactive" in row and "tokens_per_minute" in row and "6000" in row
    assert f"{acme['prefix']}…" in row and ">7<" in row and ">700<" in row
    assert acme["key"] not in html and TenantKey.objects.get().key_hash not in html
    assert 'href="/tenants/"' in html  # the site navigation


def test_a_tenants_page_shows_its_keys_usage_csv_link_and_chart_slots(client_for, viewer, acme, deployment):
    from controlplane.tenants.models import TenantUsage

    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    TenantUsage.objects.create(tenant="acme", deployment=deployment, hour=now, requests=2,
                               prompt_tokens=1_000_000, completion_tokens=500_000)
    response = client_for(viewer).get("/tenants/acme/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f"<code>{acme['prefix']}…</code>" in html and acme["key"] not in html
    assert 'href="/api/v1/tenants/acme/usage.csv"' in html
    usage = html[html.index('<tr data-deployment="demo">'):]
    usage = usage[:usage.index("</tr>")]
    assert ">1000000<" in usage and ">3.0<" in usage  # 1M prompt at 1.5 + 0.5M completion at 3
    assert 'data-url="/tenants/acme/charts.json"' in html and "dashboard.js" in html
    assert foreign_assets(html) == []
    assert client_for(viewer).get("/tenants/nobody/").status_code == 404
    # The deployment page's usage table links each tenant to its page.
    deployment_page = client_for(viewer).get("/deployments/demo/").content.decode()
    assert '<a href="/tenants/acme/"><code>acme</code></a>' in deployment_page


def test_the_chart_data_draws_each_deployment_of_the_tenant_and_says_why_a_chart_is_empty(client_for, viewer, acme,
                                                                                          deployment):
    from controlplane.observability.models import TenantSample

    now = time.time()
    TenantSample.objects.bulk_create([
        TenantSample(ts=now - 30 + i * 5, deployment_id=deployment.pk, tenant=tenant, metric=METRIC_IDS[metric],
                     value=value)
        for i in range(4) for tenant, metric, value in (("acme", "qps", 2.0), ("acme", "ttft_p99_seconds", 0.3),
                                                       ("other", "qps", 50.0))])
    body = client_for(viewer).get("/tenants/acme/charts.json?range=15m").json()
    assert body["order"] == ["qps", "tokens", "errors", "ttft", "queue_wait", "quota"]
    (qps,) = body["figures"]["qps"]["data"]
    assert qps["name"] == "req/s demo" and set(qps["y"]) == {2.0}  # acme's, not other's 50
    assert [trace["name"] for trace in body["figures"]["ttft"]["data"]] == ["P99 demo"]
    quota = body["figures"]["quota"]
    assert quota["data"] == [] and "no traffic from acme" in quota["layout"]["annotations"][0]["text"]
