"""The objectives form of the deployment page goes through deployment_objectives_set (the API's PATCH): operators
only, an Action per change, a bad value a message naming the objective with nothing changed."""
from __future__ import annotations

import html

import pytest

pytestmark = pytest.mark.django_db

DEFAULTS = {"ttft_p99_seconds": 10.0, "itl_p99_seconds": 1.0, "e2e_p99_seconds": 60.0}


def test_an_operator_sets_objectives_from_the_page(client_for, operator, deployment):
    from controlplane.alerting.models import AlertRule
    from controlplane.models import Action

    client = client_for(operator)
    assert 'id="objectives-form"' in client.get("/deployments/demo/").content.decode()
    response = client.post("/deployments/demo/objectives", {"ttft_p99_seconds": "2.5", "itl_p99_seconds": "0.5",
                                                            "e2e_p99_seconds": ""}, follow=True)
    page = html.unescape(response.content.decode())
    deployment.refresh_from_db()
    assert deployment.objectives == {**DEFAULTS, "ttft_p99_seconds": 2.5, "itl_p99_seconds": 0.5}
    action = Action.objects.get(kind="objectives")
    assert f"Objectives of demo set: action #{action.pk}" in page
    assert "TTFT ≤ 2.50 s" in page
    assert AlertRule.objects.get(deployment=deployment, default_key="prefill-ttft").threshold == 2.5


@pytest.mark.parametrize("posted, words", [
    ({"itl_p99_seconds": "fast"}, "objectives.itl_p99_seconds must be a number of seconds"),
    ({"itl_p99_seconds": "0.5", "ttft_p99_seconds": "-1"}, "objectives.ttft_p99_seconds must be more than 0"),
    ({"e2e_p99_seconds": "nan"}, "objectives.e2e_p99_seconds must be a number of seconds"),
    ({}, "objectives must name at least one objective"),
])
def test_a_bad_value_is_a_message_naming_it_and_nothing_changes(client_for, operator, deployment, posted, words):
    from controlplane.models import Action

    response = client_for(operator).post("/deployments/demo/objectives", posted, follow=True)
    assert words in html.unescape(response.content.decode())
    deployment.refresh_from_db()
    assert deployment.objectives == DEFAULTS
    assert not Action.objects.filter(kind="objectives").exists()


def test_a_viewer_sees_the_objectives_but_no_form_and_may_not_post(client_for, viewer, deployment):
    page = client_for(viewer).get("/deployments/demo/").content.decode()
    assert 'id="objectives"' in page and 'id="objectives-form"' not in page
    assert client_for(viewer).post("/deployments/demo/objectives", {"itl_p99_seconds": "0.5"}).status_code == 403
    deployment.refresh_from_db()
    assert deployment.objectives == DEFAULTS
