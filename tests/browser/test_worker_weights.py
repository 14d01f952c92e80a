"""In a browser: the deployment page's workers table shows each worker's routing weight next to its node, and a
relabelled node's new weight appears with the page's 5-second refresh."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_a_workers_weight_shows_and_follows_its_nodes_label(page, live_server, login, viewer, fleet, node,
                                                          screenshot):
    from controlplane.models import Worker
    from controlplane.services.actions import Actor
    from controlplane.services.nodes import node_labels_set

    decode = Worker.objects.get(deployment=fleet["deployment"], role="decode")
    gateway = Worker.objects.get(deployment=fleet["deployment"], role="gateway")
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    assert page.locator(f"[data-testid='weight-{decode.pk}']").inner_text() == "1"
    assert page.locator(f"[data-testid='weight-{gateway.pk}']").inner_text() == "–"
    assert page.locator("#workers thead th").nth(4).inner_text() == "weight"

    node_labels_set(node=node, labels={"tandem.weight": "3"}, actor=Actor.system("test"))
    page.wait_for_function(f"() => document.querySelector(\"[data-testid='weight-{decode.pk}']\").textContent"
                           " === '3'", timeout=30_000)
    screenshot(page, "deployment-worker-weights")
    assert page.js_errors == []
