"""The deployment page's per-tenant usage of the last 24 hours: one row per tenant, most tokens first, summed over
the hours; older hours and other deployments' usage left out."""
from __future__ import annotations

import re
import time

import pytest

from controlplane.tenants.usage import add_usage, usage_rows

pytestmark = pytest.mark.django_db


def _rows(html: str) -> list[str]:
    table = re.search(r'<table[^>]*id="tenant-usage-table".*?</table>', html, re.S).group(0)
    body = re.search(r"<tbody>.*?</tbody>", table, re.S).group(0)
    return [" ".join(re.sub(r"<[^>]+>", " ", row).split()) for row in re.findall(r"<tr.*?</tr>", body, re.S)]


def _use(deployment, ts, tenant, requests, prompt, completion, limited=0):
    add_usage(usage_rows(ts, deployment.pk, {tenant: {"requests": requests, "prompt_tokens": prompt,
                                                      "completion_tokens": completion, "errors": 0,
                                                      "rate_limited": limited, "shed": 0}}))


def test_the_deployment_page_shows_each_tenants_last_24_hours(client_for, viewer, deployment, make_deployment):
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _rows(html) == ["No tenant used it in the last 24 hours."]
    now = time.time()
    _use(deployment, now - 60, "acme", 2, 100, 40)
    _use(deployment, now - 7200, "acme", 3, 300, 60, limited=4)
    _use(deployment, now - 60, "beta", 50, 1000, 900)
    _use(deployment, now - 3 * 86400, "gamma", 1, 1, 1)  # too old
    _use(make_deployment("other"), now - 60, "delta", 1, 1, 1)  # another deployment's
    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert _rows(html) == ["beta 50 1000 900 0 0 0", "acme 5 400 100 0 4 0"]
