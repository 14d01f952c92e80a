"""Fleet overview: each deployment's health, desired vs ready per pool, firing alerts, P99 TTFT and ITL,
tokens/s; the nodes with their GPUs."""
from __future__ import annotations

import re

import pytest
from django.utils import timezone

from controlplane.alerting.models import Alert, AlertRule
from controlplane.models import Node

pytestmark = pytest.mark.django_db


def _row(text, name):
    return re.search(rf'<tr>\s*<td><a href="/deployments/{name}/">(.*?)</tr>', text, re.S).group(1)


def test_a_deployment_with_every_worker_ready_is_healthy_and_shows_its_latest_numbers(
        client_for, viewer, deployment, make_worker, seed_samples):
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    seed_samples(deployment, "ttft_p99_seconds", [0.5, 0.25], role="gateway")
    seed_samples(deployment, "ttft_p99_seconds", [0.9], role="prefill")  # the gateway's view wins
    seed_samples(deployment, "itl_p99_seconds", [0.042], role="decode")  # no gateway series: the decode pool's
    seed_samples(deployment, "generation_tokens_per_second", [123.4], role="gateway")
    row = _row(client_for(viewer).get("/").content.decode(), "demo")
    assert "healthy" in row
    assert "prefill\n          <strong>1</strong>/1" in row and "decode\n          <strong>1</strong>/1" in row
    assert "250 ms" in row and "42 ms" in row and "123.4" in row


def test_missing_workers_and_firing_alerts_make_it_degraded_or_down(client_for, viewer, make_deployment,
                                                                    make_worker):
    degraded = make_deployment("half")
    make_worker(degraded, "prefill")
    make_worker(degraded, "decode")
    rule = AlertRule.objects.create(name="errors", deployment=degraded, metric="error_ratio", comparison=">",
                                    threshold=0.01)
    now = timezone.now()
    Alert.objects.create(rule=rule, fingerprint="x", deployment=degraded, state="firing", active_at=now,
                         fired_at=now, last_true_at=now, last_evaluated_at=now)
    down = make_deployment("dead")
    make_worker(down, "decode")
    text = client_for(viewer).get("/").content.decode()
    half, dead = _row(text, "half"), _row(text, "dead")
    assert "degraded" in half and "1 alert firing" in half and "1 firing" in half
    assert "down" in dead and "prefill: no ready worker of 1" in dead
    assert "–" in dead  # no samples: no number, rather than a misleading 0


def test_nodes_list_their_gpus_or_say_they_have_none(client_for, viewer, node):
    Node.objects.create(name="gpu-1", hostname="gpu-1.example", last_seen_at=timezone.now(),
                        gpus=[{"index": 0, "name": "NVIDIA H100", "memory_total_bytes": 80 * 2**30}])
    text = client_for(viewer).get("/").content.decode()
    nodes = text.split('id="nodes"')[1]
    assert "GPU 0 · NVIDIA H100 · 80.0 GiB" in nodes and "online" in nodes
    assert "no GPU on this host (CPU only)" in nodes and "offline" in nodes


def test_an_empty_fleet_says_how_to_start(client_for, viewer):
    text = client_for(viewer).get("/").content.decode()
    assert "No deployments yet" in text and "No node agent has registered yet" in text


def test_tokens_per_second_carry_their_unit(client_for, viewer, deployment, make_worker, seed_samples):
    make_worker(deployment, "decode")
    seed_samples(deployment, "generation_tokens_per_second", [123.4], role="gateway")
    assert "123.4 tokens/s" in _row(client_for(viewer).get("/").content.decode(), "demo")


def test_shared_gateways_show_their_process_url_and_what_they_serve(client_for, viewer, make_deployment, node):
    from controlplane.models import Deployment, SharedGateway, Worker

    front = SharedGateway.objects.create(name="front", port=41700, node=node)
    SharedGateway.objects.create(name="spare", port=41701)
    for name in ("alpha", "beta"):
        make_deployment(name)
    Deployment.objects.filter(name__in=("alpha", "beta")).update(shared_gateway=front, gateway_port=None)
    Worker.objects.create(shared_gateway=front, role="gateway", node=node, status="ready", port=41700, pid=4242)
    text = client_for(viewer).get("/").content.decode()
    row = re.search(r'<tr data-testid="shared-gateway-front">(.*?)</tr>', text, re.S).group(1)
    assert "ready" in row and f"{front.url}/v1" in row
    assert '<a href="/deployments/alpha/">alpha</a>, <a href="/deployments/beta/">beta</a>' in row
    spare = re.search(r'<tr data-testid="shared-gateway-spare">(.*?)</tr>', text, re.S).group(1)
    assert "nothing attached" in spare and "stopped (serves nothing)" in spare
    assert "shared gateway front :41700" in _row(text, "alpha")
