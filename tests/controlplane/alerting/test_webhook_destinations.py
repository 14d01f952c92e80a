"""Webhook channels may not point at loopback, link-local or private addresses (cloud metadata, the control
plane's own services) unless TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS is on: refused when saved (400 naming the
setting) and again before each delivery try (a name can be pointed elsewhere later)."""
from __future__ import annotations

import pytest

from controlplane.alerting.models import Channel, Delivery
from controlplane.alerting.services.notifications import delivery_send

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _production_default(settings):
    settings.TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS = False


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "http://localhost/x", "http://10.1.2.3/hook",
                                 "http://169.254.169.254/latest/meta-data", "http://[::1]/x",
                                 "http://[::ffff:192.168.0.1]/x", "http://0.0.0.0/x"])
def test_a_channel_to_a_non_public_address_is_a_400(admin_api, url):
    response = admin_api.post("/api/v1/channels/", {"name": "inside", "kind": "webhook", "url": url}, format="json")
    assert response.status_code == 400, response.content
    assert "TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1" in response.json()["error"]["message"]
    assert not Channel.objects.exists()


def test_a_public_address_or_a_name_that_does_not_resolve_here_is_accepted(admin_api):
    for name, url in (("public", "http://8.8.8.8/x"),
                      ("named", "https://hooks.example.com/x")):
        response = admin_api.post("/api/v1/channels/", {"name": name, "kind": "webhook", "url": url},
                                  format="json")
        assert response.status_code == 201, response.content


def test_the_setting_allows_them(admin_api, settings):
    settings.TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS = True
    response = admin_api.post("/api/v1/channels/", {"name": "lab", "kind": "webhook", "url": "http://10.1.2.3/x"},
                              format="json")
    assert response.status_code == 201


def test_a_delivery_to_a_channel_that_now_points_inside_fails_without_a_request(quiet_deployment, admin):
    # A row written before the rule (or a name re-pointed since): the transport checks again and sends nothing.
    channel = Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/x")
    delivery = Delivery.objects.create(channel=channel, event="firing", payload={"x": 1}, idempotency_key="d-1")
    delivery = delivery_send(delivery_id=delivery.pk)
    assert delivery.status == "failed" and "destination refused" in delivery.error
    assert delivery.attempts == 1
