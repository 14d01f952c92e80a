"""While the database refuses writes (read-only), a write through the API answers 503 JSON saying so, with
Retry-After, and changes nothing; reads still answer, and /healthz says "degraded" naming it. The refusal is the
database's own: SQLite's query_only pragma, PostgreSQL's read-only transaction mode, on the connection the request
uses."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import connection

from controlplane.models import Action, Pool

# No test transaction around it: each request's own transaction meets the read-only database, as in production.
pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def read_only_database():
    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA query_only = ON" if sqlite else "SET SESSION default_transaction_read_only = on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA query_only = OFF" if sqlite else "SET SESSION default_transaction_read_only = off")


def test_a_write_while_the_database_is_read_only_is_a_503_json_that_changes_nothing(operator_api, deployment):
    with read_only_database():
        response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 3},
                                     format="json")
        assert response.status_code == 503, response.content
        assert response["Content-Type"].startswith("application/json")
        assert response["Retry-After"] == "5"
        error = response.json()["error"]
        assert error["code"] == "database_unavailable"
        assert "refuses" in error["message"] and "nothing was changed" in error["message"]
        assert "read" in error["message"].lower()  # the database's own words: read-only / readonly
        assert operator_api.get("/api/v1/deployments/demo/").status_code == 200  # reads still answer
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 1
    assert not Action.objects.filter(kind="scale").exists()


def test_healthz_says_the_database_refuses_writes_and_still_answers_200(anon_api):
    with read_only_database():
        response = anon_api.get("/healthz")
    assert response.status_code == 200  # reads still serve: a load balancer keeps sending traffic
    body = response.json()
    assert body["status"] == "degraded" and body["database"].startswith("read-only"), body
    assert body["problems"][0].startswith("database read-only") and "API writes answer 503" in body["problems"][0]
    assert anon_api.get("/healthz").json()["database"] == "ok"
