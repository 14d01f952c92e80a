"""The autoscaler switch goes through the autoscaler's autoscaling_update (the API's PUT .../autoscaling)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_an_operator_turns_the_autoscaler_on_and_off(client_for, operator, deployment):
    client = client_for(operator)
    response = client.post("/deployments/demo/autoscaling", {"enabled": "on"}, follow=True)
    deployment.refresh_from_db()
    assert deployment.autoscale_enabled
    assert "Autoscaler of demo turned on." in response.content.decode()
    assert "Turn autoscaler off" in response.content.decode()
    client.post("/deployments/demo/autoscaling", {"enabled": "off"})
    deployment.refresh_from_db()
    assert not deployment.autoscale_enabled


def test_a_bad_value_is_a_message_and_a_viewer_is_refused(client_for, operator, viewer, deployment):
    response = client_for(operator).post("/deployments/demo/autoscaling", {"enabled": "maybe"}, follow=True)
    assert "enabled must be on or off" in response.content.decode()
    assert client_for(viewer).post("/deployments/demo/autoscaling", {"enabled": "on"}).status_code == 403
    deployment.refresh_from_db()
    assert not deployment.autoscale_enabled
