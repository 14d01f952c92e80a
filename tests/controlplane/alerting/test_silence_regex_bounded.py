"""Silence matchers run on RE2: a pattern that makes a backtracking engine take exponential time (`(.*.*)*X`)
is matched in linear time, evaluation and the alerts page stay quick, and patterns and matcher lists are bounded."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting.services.silences import MAX_MATCHERS, silence_for

pytestmark = pytest.mark.django_db
CATASTROPHIC = "(.*.*)*X"


def _body(matchers):
    return {"matchers": matchers, "comment": "maintenance",
            "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()}


def test_a_catastrophic_pattern_is_accepted_and_matched_in_linear_time(operator_api):
    response = operator_api.post("/api/v1/silences/", _body([{"name": "role", "value": CATASTROPHIC,
                                                              "is_regex": True}]), format="json")
    assert response.status_code == 201, response.content
    started = time.monotonic()
    # Python's re takes minutes on this label; RE2 answers at once.
    assert silence_for({"role": "a" * 5000 + "Y"}) is None
    assert silence_for({"role": "a" * 5000 + "X"}) is not None
    assert time.monotonic() - started < 5  # Python's re: minutes; room for a loaded host


def test_the_alerts_page_answers_quickly_with_such_a_silence(operator_api, client, operator):
    operator_api.post("/api/v1/silences/", _body([{"name": "alertname", "value": CATASTROPHIC, "is_regex": True}]),
                      format="json")
    client.force_login(operator)
    started = time.monotonic()
    assert client.get("/alerts/").status_code == 200
    assert time.monotonic() - started < 5


def test_a_pattern_re2_does_not_support_is_a_400_that_says_so(operator_api):
    response = operator_api.post("/api/v1/silences/", _body([{"name": "role", "value": "(?=decode)",
                                                              "is_regex": True}]), format="json")
    assert response.status_code == 400
    assert "not a valid regex (RE2 syntax)" in response.json()["error"]["message"]


def test_too_many_matchers_or_a_too_long_value_is_a_400(operator_api):
    many = [{"name": "role", "value": "decode"}] * (MAX_MATCHERS + 1)
    response = operator_api.post("/api/v1/silences/", _body(many), format="json")
    assert response.status_code == 400 and f"at most {MAX_MATCHERS} matchers" in response.json()["error"]["message"]
    response = operator_api.post("/api/v1/silences/", _body([{"name": "role", "value": "d" * 5000}]), format="json")
    assert response.status_code == 400 and "longer than 1024 characters" in response.json()["error"]["message"]
