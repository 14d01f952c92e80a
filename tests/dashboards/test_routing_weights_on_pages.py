"""The deployment page shows each worker's routing weight next to its node (what the gateway's membership gives
it), and a pool's routing_weights under the pool."""
from __future__ import annotations

import re

import pytest

from controlplane.models import Node, Pool

pytestmark = pytest.mark.django_db


def test_each_worker_shows_the_weight_its_node_gives_it(client_for, viewer, deployment, make_worker):
    compute = Node.objects.create(name="compute-01", labels={"class": "compute"})
    plain = Node.objects.create(name="plain-01", labels={"tandem.weight": "2"})
    Pool.objects.filter(deployment=deployment, role="decode").update(
        routing_weights=[{"selector": {"class": "compute"}, "weight": 3}])
    on_compute = make_worker(deployment, "decode", node=compute)
    on_plain = make_worker(deployment, "decode", node=plain)
    prefill = make_worker(deployment, "prefill", node=compute)
    gateway = make_worker(deployment, "gateway", node=compute)

    html = client_for(viewer).get("/deployments/demo/").content.decode()

    def weight(worker) -> str:
        return re.search(rf'data-testid="weight-{worker.pk}">([^<]*)<', html).group(1)

    assert (weight(on_compute), weight(on_plain), weight(prefill), weight(gateway)) == ("3", "2", "1", "–")
    assert re.search(r'data-testid="routing-weights-decode">weights class=compute → 3<', html)
    assert 'data-testid="routing-weights-prefill"' not in html
