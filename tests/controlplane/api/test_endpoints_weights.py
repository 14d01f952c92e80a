"""The endpoints answer carries each ready worker's routing weight, computed from its node's labels: the first of
its pool's routing_weights whose selector the node matches, else the node's `tandem.weight` label, else 1."""
from __future__ import annotations

import pytest

from controlplane.models import Node

pytestmark = pytest.mark.django_db


def _node(name: str, **labels) -> Node:
    return Node.objects.create(name=name, labels=labels, detected_labels={"gpu.count": "1", "cpu.count": "16"})


def _weights(api) -> dict:
    group, = api.get("/api/v1/deployments/demo/endpoints").json()["groups"]
    return group["weights"]


def test_each_worker_weighs_what_its_nodes_labels_say(admin_api, viewer_api, deployment, make_worker):
    compute = _node("compute-01", **{"class": "compute"})
    labelled = _node("big-01", **{"tandem.weight": "2.5"})
    plain = _node("plain-01")
    on_compute = make_worker(deployment, "decode", node=compute)
    on_labelled = make_worker(deployment, "decode", node=labelled)
    on_plain = make_worker(deployment, "decode", node=plain)
    prefill = make_worker(deployment, "prefill", node=compute)

    response = admin_api.patch("/api/v1/deployments/demo/pools/decode", {"routing_weights": [
        {"selector": {"class": "compute"}, "weight": 3}]}, format="json")
    assert response.status_code == 200, response.content
    assert _weights(viewer_api) == {on_compute.url: 3, on_labelled.url: 2.5, on_plain.url: 1,
                                    prefill.url: 1}  # the prefill pool has no routing_weights


def test_the_first_matching_entry_wins_over_later_ones_and_over_the_node_label(admin_api, viewer_api, deployment,
                                                                              make_worker):
    node = _node("compute-01", **{"class": "compute", "tandem.weight": "7"})
    worker = make_worker(deployment, "decode", node=node)
    admin_api.patch("/api/v1/deployments/demo/pools/decode", {"routing_weights": [
        {"selector": {"gpu.count": "1", "class": "compute"}, "weight": 4},
        {"selector": {"class": "compute"}, "weight": 2}]}, format="json")
    assert _weights(viewer_api) == {worker.url: 4}
    admin_api.patch("/api/v1/deployments/demo/pools/decode", {"routing_weights": [
        {"selector": {"class": "bandwidth"}, "weight": 4}]}, format="json")
    assert _weights(viewer_api) == {worker.url: 7}  # no entry matches: the node's label


def test_a_relabelled_node_changes_its_workers_weight_at_once(admin_api, viewer_api, deployment, make_worker):
    node = _node("plain-01")
    worker = make_worker(deployment, "decode", node=node)
    assert _weights(viewer_api) == {worker.url: 1}
    response = admin_api.patch("/api/v1/nodes/plain-01/", {"labels": {"tandem.weight": "3"}}, format="json")
    assert response.status_code == 200, response.content
    assert _weights(viewer_api) == {worker.url: 3}
