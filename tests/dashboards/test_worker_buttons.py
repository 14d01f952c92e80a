"""Restart and drain a worker from the workers table: the worker services' pending actions; conflicts show as
messages."""
from __future__ import annotations

import pytest

from controlplane.models import Action

pytestmark = pytest.mark.django_db


def test_an_operator_restarts_a_worker(client_for, operator, deployment, make_worker):
    worker = make_worker(deployment, "decode")
    response = client_for(operator).post(f"/workers/{worker.pk}/restart", follow=True)
    action = Action.objects.get(kind="restart")
    assert action.worker == worker and action.status == "pending" and action.actor == "otto-operator"
    assert f"Restarting decode worker #{worker.pk}: action #{action.pk} is pending" in response.content.decode()


def test_an_operator_drains_a_worker(client_for, operator, deployment, make_worker):
    worker = make_worker(deployment, "prefill")
    client_for(operator).post(f"/workers/{worker.pk}/drain")
    assert Action.objects.get(kind="drain").worker == worker


def test_a_second_restart_while_one_is_pending_is_a_message(client_for, operator, deployment, make_worker):
    worker = make_worker(deployment, "decode")
    client = client_for(operator)
    client.post(f"/workers/{worker.pk}/restart")
    response = client.post(f"/workers/{worker.pk}/drain", follow=True)
    assert response.status_code == 200
    assert "already has a restart in progress" in response.content.decode()
    assert Action.objects.filter(kind__in=["restart", "drain"]).count() == 1


def test_draining_a_gateway_is_a_message(client_for, operator, deployment, make_worker):
    gateway = make_worker(deployment, "gateway")
    response = client_for(operator).post(f"/workers/{gateway.pk}/drain", follow=True)
    assert "a gateway cannot be drained" in response.content.decode()


def test_viewers_are_refused_and_unknown_workers_are_404(client_for, viewer, operator, deployment, make_worker):
    worker = make_worker(deployment, "decode")
    assert client_for(viewer).post(f"/workers/{worker.pk}/restart").status_code == 403
    assert client_for(viewer).post(f"/workers/{worker.pk}/drain").status_code == 403
    assert not Action.objects.filter(kind__in=["restart", "drain"]).exists()
    assert client_for(operator).post("/workers/999999/restart").status_code == 404
    assert client_for(operator).post(f"/workers/{2**64}/drain").status_code == 404
