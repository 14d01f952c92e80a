"""Scaling a pool from the deployment page: +1, −1 and set go through pool_scale (an audited action), errors
become messages, viewers are refused by the server, CSRF is enforced."""
from __future__ import annotations

import html
import re

import pytest

from controlplane.models import Action, Pool

pytestmark = pytest.mark.django_db


def _desired(deployment, role):
    return Pool.objects.get(deployment=deployment, role=role).desired_replicas


def test_an_operator_scales_decode_up_by_one_and_an_action_row_records_it(client_for, operator, deployment):
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", {"op": "up"}, follow=True)
    assert _desired(deployment, "decode") == 2
    action = Action.objects.get(kind="scale")
    assert (action.actor, action.actor_type, action.params) == ("otto-operator", "user",
                                                                {"role": "decode", "from": 1, "to": 2})
    assert action.reason.startswith("dashboard:")
    html = response.content.decode()
    assert f"action #{action.pk} is pending" in html
    assert f'data-testid="action-status-{action.pk}"' in html  # the progress row, refreshed every 5 s


def test_minus_one_and_set_change_the_desired_replicas(client_for, operator, deployment):
    client = client_for(operator)
    client.post("/deployments/demo/pools/prefill/scale", {"op": "set", "replicas": "4"})
    assert _desired(deployment, "prefill") == 4
    client.post("/deployments/demo/pools/prefill/scale", {"op": "down"})
    assert _desired(deployment, "prefill") == 3
    assert Action.objects.filter(kind="scale").count() == 2


def test_replicas_outside_min_max_show_the_services_message_not_a_500(client_for, operator, deployment):
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", {"op": "set", "replicas": "99"},
                                         follow=True)
    assert response.status_code == 200
    assert "replicas for decode must be between 1 and 8 (min..max), not 99" in response.content.decode()
    assert _desired(deployment, "decode") == 1 and not Action.objects.filter(kind="scale").exists()


@pytest.mark.parametrize("data", [{"op": "set", "replicas": "two"}, {"op": "set", "replicas": ""},
                                  {"op": "set", "replicas": "--5"}, {"op": "set", "replicas": "1234567"},
                                  {"op": "sideways"}, {}])
def test_bad_input_is_a_message(client_for, operator, deployment, data):
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", data, follow=True)
    assert response.status_code == 200 and 'class="msg error"' in response.content.decode()
    assert not Action.objects.filter(kind="scale").exists()


def test_an_unknown_pool_is_a_message(client_for, operator, deployment):
    response = client_for(operator).post("/deployments/demo/pools/colocated/scale", {"op": "up"}, follow=True)
    assert "has no 'colocated' pool" in html.unescape(response.content.decode())


def test_the_same_form_posted_twice_scales_once(client_for, operator, deployment):
    client = client_for(operator)
    data = {"op": "up", "idempotency_key": "dash-double-click"}
    client.post("/deployments/demo/pools/decode/scale", data)
    client.post("/deployments/demo/pools/decode/scale", data)
    assert _desired(deployment, "decode") == 2 and Action.objects.filter(kind="scale").count() == 1


def test_a_viewer_is_refused_by_the_server(client_for, viewer, deployment):
    response = client_for(viewer).post("/deployments/demo/pools/decode/scale", {"op": "up"})
    assert response.status_code == 403
    assert _desired(deployment, "decode") == 1 and not Action.objects.filter(kind="scale").exists()


def test_a_get_is_not_allowed(client_for, operator, deployment):
    assert client_for(operator).get("/deployments/demo/pools/decode/scale").status_code == 405


def test_a_post_without_the_csrf_token_is_refused_and_with_it_goes_through(client_for, operator, deployment):
    client = client_for(operator, enforce_csrf=True)
    assert client.post("/deployments/demo/pools/decode/scale", {"op": "up"}).status_code == 403
    assert _desired(deployment, "decode") == 1
    html = client.get("/deployments/demo/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    response = client.post("/deployments/demo/pools/decode/scale", {"op": "up", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and _desired(deployment, "decode") == 2


def test_the_page_comes_back_to_the_chosen_time_range_with_the_action_named(client_for, operator, deployment):
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", {"op": "up", "range": "6h"})
    action = Action.objects.get(kind="scale")
    assert response["Location"] == f"/deployments/demo/?range=6h&action={action.pk}"
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", {"op": "up", "range": "x"})
    assert "range" not in response["Location"]


def test_plus_one_at_max_says_the_pool_is_at_its_max(client_for, operator, deployment):
    Pool.objects.filter(deployment=deployment, role="decode").update(desired_replicas=8)
    response = client_for(operator).post("/deployments/demo/pools/decode/scale", {"op": "up"}, follow=True)
    assert "decode pool already at its max (8 replicas)" in response.content.decode()
    assert not Action.objects.filter(kind="scale").exists()
