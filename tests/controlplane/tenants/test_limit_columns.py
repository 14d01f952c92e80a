"""The control plane reads the tenant limits the gateway declares (inference/gateway/tenant_limits.py): each is a
nullable column of Tenant, a tenant's `limits` in the API, and checked against its declared bound."""
from __future__ import annotations

import pytest
from django.db import models

from controlplane.tenants.models import Tenant
from inference.gateway.tenant_limits import TENANT_LIMITS

pytestmark = pytest.mark.django_db


def test_each_declared_limit_is_a_nullable_column_of_tenant_and_wide_where_declared():
    for limit in TENANT_LIMITS:
        column = Tenant._meta.get_field(limit.name)
        assert column.null
        wide = isinstance(column, models.PositiveBigIntegerField)
        assert isinstance(column, models.PositiveIntegerField) or wide
        assert wide == limit.wide, limit.name


def test_every_declared_limit_is_set_through_the_api_up_to_its_bound_and_refused_above(admin_api):
    at_bound = {limit.name: limit.high for limit in TENANT_LIMITS}
    response = admin_api.post("/api/v1/tenants/", {"name": "acme", "limits": at_bound}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["limits"] == at_bound
    for limit in TENANT_LIMITS:
        above = admin_api.patch("/api/v1/tenants/acme/", {"limits": {limit.name: limit.high + 1}}, format="json")
        assert above.status_code == 400 and above.json()["error"]["field"] == f"limits.{limit.name}"
