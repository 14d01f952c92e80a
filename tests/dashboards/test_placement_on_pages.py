"""The pages show placement: each node's set and detected labels on the overview, and on the deployment page a
pool that cannot be placed, marked unschedulable with the reason (also among the deployment's problems)."""
from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.models import Node, Pool

pytestmark = pytest.mark.django_db


def test_the_overview_lists_node_labels(client_for, viewer):
    Node.objects.create(name="gpu-01", last_seen_at=timezone.now(), labels={"class": "bandwidth"},
                        detected_labels={"gpu.count": "1", "cpu.count": "16"})
    html = client_for(viewer).get("/").content.decode()
    assert "class=bandwidth" in html and "gpu.count=1" in html and "cpu.count=16" in html


def test_an_unschedulable_pool_says_why_on_the_deployment_page(client_for, viewer, deployment):
    Pool.objects.filter(deployment=deployment, role="decode").update(
        node_selector={"class": "bandwidth"}, unschedulable_replicas=1,
        unschedulable_reason="1 of 1 workers cannot be placed: no online node matches class=bandwidth")
    client = client_for(viewer)
    html = client.get("/deployments/demo/").content.decode()
    assert 'data-testid="unschedulable-decode"' in html
    assert "no online node matches class=bandwidth" in html and "on class=bandwidth" in html
    assert "decode unschedulable: 1 of 1 workers cannot be placed" in client.get("/").content.decode()
