"""GET /api/v1/tenants/{name}/usage and usage.csv: hourly rows per deployment with totals over a range (default:
this month), one deployment's only, 400s naming a bad parameter, 404 for a name with neither a tenant nor usage."""
from __future__ import annotations

import csv
import io

import pytest

from controlplane.services.actions import Actor
from controlplane.tenants.models import Tenant
from controlplane.tenants.services import tenant_delete
from controlplane.tenants.usage import add_usage, usage_rows

pytestmark = pytest.mark.django_db

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def use(deployment, ts, tenant="acme", requests=1, prompt=10, completion=5):
    add_usage(usage_rows(ts, deployment.pk, {tenant: {"requests": requests, "prompt_tokens": prompt,
                                                      "completion_tokens": completion, "errors": 0,
                                                      "rate_limited": 0, "shed": 0}}))


@pytest.fixture
def usage(deployment, make_deployment):
    other = make_deployment("other")
    Tenant.objects.create(name="acme")
    use(deployment, T0 + 10, requests=2, prompt=100, completion=40)
    use(deployment, T0 + 3600 + 10, requests=3, prompt=300, completion=60)
    use(other, T0 + 20, requests=1, prompt=7, completion=1)
    use(deployment, T0 + 30, tenant="beta", requests=9)  # another tenant's: never in acme's answer
    use(deployment, T0 - 86400)  # the day before
    return deployment, other


def test_rows_per_hour_and_deployment_with_totals(viewer_api, usage):
    body = viewer_api.get("/api/v1/tenants/acme/usage", {"start": T0, "end": "2027-01-15T10:00:00Z"}).json()
    assert body["start"] == "2027-01-15T08:00:00Z" and body["end"] == "2027-01-15T10:00:00Z"
    assert [(r["hour"], r["deployment"], r["requests"], r["prompt_tokens"], r["completion_tokens"])
            for r in body["rows"]] == [("2027-01-15T08:00:00Z", "demo", 2, 100, 40),
                                       ("2027-01-15T08:00:00Z", "other", 1, 7, 1),
                                       ("2027-01-15T09:00:00Z", "demo", 3, 300, 60)]
    assert body["totals"] == {"requests": 6, "prompt_tokens": 407, "completion_tokens": 101, "errors": 0,
                              "rate_limited": 0, "shed": 0, "cost": None}
    # The hour `start` falls in is included; one deployment only.
    one = viewer_api.get("/api/v1/tenants/acme/usage", {"start": T0 + 1800, "end": T0 + 7200,
                                                        "deployment": "other"}).json()
    assert [r["deployment"] for r in one["rows"]] == ["other"] and one["totals"]["requests"] == 1


def test_the_default_range_is_this_month(viewer_api, usage, monkeypatch):
    monkeypatch.setattr("controlplane.tenants.usage_api.time.time", lambda: T0 + 7200)
    body = viewer_api.get("/api/v1/tenants/acme/usage").json()
    assert body["start"] == "2027-01-01T00:00:00Z"
    assert body["totals"]["requests"] == 1 + 2 + 3 + 1  # the day before is this month too


def test_csv_has_a_row_per_hour_and_deployment_then_a_total(viewer_api, usage):
    response = viewer_api.get("/api/v1/tenants/acme/usage.csv", {"start": T0, "end": T0 + 7200})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="acme-usage.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["tenant", "hour", "deployment", "requests", "prompt_tokens", "completion_tokens", "errors",
                       "rate_limited", "shed", "cost"]
    assert rows[1] == ["acme", "2027-01-15T08:00:00Z", "demo", "2", "100", "40", "0", "0", "0", ""]
    assert rows[-1] == ["acme", "total", "", "6", "407", "101", "0", "0", "0", ""]  # not priced: no cost
    assert len(rows) == 5


@pytest.mark.parametrize("params, field", [
    ({"start": "yesterday"}, "start"),
    ({"end": "2027-13-01T00:00:00Z"}, "end"),
    ({"start": T0 + 10, "end": T0}, "start"),
    ({"deployment": "nope"}, "deployment"),
])
def test_a_bad_parameter_is_a_400_naming_it(viewer_api, usage, params, field):
    for path in ("usage", "usage.csv"):
        response = viewer_api.get(f"/api/v1/tenants/acme/{path}", params)
        assert response.status_code == 400, response.content
        assert response.json()["error"]["field"] == field


def test_who_may_read_and_which_names_exist(viewer_api, anon_api, outsider_api, usage):
    assert anon_api.get("/api/v1/tenants/acme/usage").status_code in (401, 403)
    assert outsider_api.get("/api/v1/tenants/acme/usage").status_code == 403
    assert viewer_api.get("/api/v1/tenants/nobody/usage").status_code == 404
    # A deleted tenant's usage (and `beta`, never a tenant here) stays readable: it is a bill, kept under the
    # tenant's name and id; a new tenant of the same name starts with none of it.
    acme = Tenant.objects.get(name="acme")
    tenant_delete(tenant=acme, actor=Actor.system("test"))
    assert viewer_api.get(f"/api/v1/tenants/acme~{acme.pk}/usage", {"start": T0, "end": T0 + 7200}).json()[
        "totals"]["requests"] == 6
    assert viewer_api.get("/api/v1/tenants/acme/usage").status_code == 404
    Tenant.objects.create(name="acme")
    assert viewer_api.get("/api/v1/tenants/acme/usage", {"start": T0, "end": T0 + 7200}).json()["totals"][
        "requests"] == 0
    assert viewer_api.get("/api/v1/tenants/beta/usage", {"start": T0, "end": T0 + 7200}).status_code == 200
    # A tenant that has used nothing yet: empty rows, zero totals.
    Tenant.objects.create(name="quiet")
    body = viewer_api.get("/api/v1/tenants/quiet/usage").json()
    assert body["rows"] == [] and body["totals"]["requests"] == 0


def test_prices_per_million_tokens_turn_usage_into_cost(admin_api, viewer_api, usage):
    from controlplane.models import Action

    response = admin_api.patch("/api/v1/tenants/acme/", {"prices": {"prompt": 2.5, "completion": 10}},
                               format="json")
    assert response.status_code == 200, response.content
    assert response.json()["prices"] == {"prompt": 2.5, "completion": 10.0}
    assert Action.objects.filter(kind="tenant").last().params["prices"] == {"prompt": "2.5", "completion": "10"}
    body = viewer_api.get("/api/v1/tenants/acme/usage", {"start": T0, "end": T0 + 7200}).json()
    assert body["prices"] == {"prompt": 2.5, "completion": 10.0}
    assert [r["cost"] for r in body["rows"]] == [0.00065, 0.0000275, 0.00135]  # (100×2.5 + 40×10) / 1M, ...
    assert body["totals"]["cost"] == 0.0020275
    rows = list(csv.reader(io.StringIO(viewer_api.get("/api/v1/tenants/acme/usage.csv",
                                                      {"start": T0, "end": T0 + 7200}).content.decode())))
    assert (rows[1][-1], rows[2][-1], rows[-1][-1]) == ("0.00065", "0.0000275", "0.0020275")
    # One price only: the other counts 0; null removes one.
    admin_api.patch("/api/v1/tenants/acme/", {"prices": {"completion": None}}, format="json")
    body = viewer_api.get("/api/v1/tenants/acme/usage", {"start": T0, "end": T0 + 7200}).json()
    assert body["prices"] == {"prompt": 2.5} and body["totals"]["cost"] == 0.0010175


@pytest.mark.parametrize("prices, field", [
    ({"prompt": -1}, "prices.prompt"), ({"completion": "cheap"}, "prices.completion"),
    ({"prompt": 0.0000001}, "prices.prompt"), ({"prompt": True}, "prices.prompt"), ({"output": 1}, "prices.output"),
    ([1, 2], "prices"),
])
def test_a_bad_price_is_a_400_naming_it(admin_api, usage, prices, field):
    response = admin_api.patch("/api/v1/tenants/acme/", {"prices": prices}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    response = admin_api.post("/api/v1/tenants/", {"name": "new", "prices": prices}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == field
