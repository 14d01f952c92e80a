"""One reconcile pass of a shared gateway: one process while it serves a deployment (sent to its node's agent),
none once it serves none; a process that lacks an attached deployment's worker key is restarted in place; a
failed process is restarted by the same policy as any gateway's, through its own reconcile."""
from __future__ import annotations

import pytest

from controlplane.models import Deployment, SharedGateway, Worker, WorkerStatus
from controlplane.services.restarts import WorkerFailure, worker_failure_record


@pytest.fixture
def front(online_node, db):
    return SharedGateway.objects.create(name="front", port=41600, node=online_node)


@pytest.fixture
def reconcile_gateway(django_capture_on_commit_callbacks):
    from controlplane.supervision.shared_gateways import reconcile_shared_gateway

    def run(gateway):
        with django_capture_on_commit_callbacks(execute=True):
            return reconcile_shared_gateway(gateway.id)

    return run


def _attach(deployment, gateway) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=gateway, gateway_port=None)


def test_it_starts_one_process_on_the_gateways_port_once_a_deployment_is_attached(
        front, deployment, online_node, sent, reconcile_gateway):
    assert reconcile_gateway(front)["created"] == [] and sent == []
    _attach(deployment, front)
    summary = reconcile_gateway(front)
    worker = Worker.objects.get(shared_gateway=front)
    assert worker.deployment is None and worker.port == 41600 and worker.node == online_node
    assert summary["created"] == summary["started"] == [worker.id]
    assert sent == [("agent_start_worker", (worker.id,), "node.local")]
    assert reconcile_gateway(front)["created"] == [] and len(sent) == 1


def test_it_restarts_a_process_that_lacks_an_attached_deployments_key(
        front, deployment, make_deployment, sent, reconcile_gateway):
    _attach(deployment, front)
    reconcile_gateway(front)
    Worker.objects.filter(shared_gateway=front).update(status=WorkerStatus.READY, pid=4242,
                                                       worker_keys_of=[deployment.pk])
    assert reconcile_gateway(front)["restarted"] == []
    other = make_deployment("other")
    _attach(other, front)
    summary = reconcile_gateway(front)
    worker = Worker.objects.get(shared_gateway=front)
    assert summary["restarted"] == [worker.id] and worker.status == WorkerStatus.PENDING
    assert "other" in worker.last_error


def test_it_stops_the_process_once_no_deployment_is_attached(front, deployment, sent, reconcile_gateway):
    _attach(deployment, front)
    reconcile_gateway(front)
    Worker.objects.filter(shared_gateway=front).update(status=WorkerStatus.READY, pid=4242)
    Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=None)
    summary = reconcile_gateway(front)
    assert Worker.objects.get(shared_gateway=front).status == WorkerStatus.DRAINING
    assert len(summary["drained"]) == 1 and sent[-1][0] == "agent_stop_worker"


def test_a_failed_process_restarts_through_its_own_reconcile(front, deployment, sent, reconcile_gateway,
                                                             django_capture_on_commit_callbacks):
    _attach(deployment, front)
    reconcile_gateway(front)
    worker = Worker.objects.get(shared_gateway=front)
    Worker.objects.filter(pk=worker.pk).update(status=WorkerStatus.READY, pid=4242)
    with django_capture_on_commit_callbacks(execute=True):
        outcome = worker_failure_record(failure=WorkerFailure(worker.id, 4242, (WorkerStatus.READY,), "exited"))
    assert outcome == "restart"
    assert sent[-1][:2] == ("reconcile_shared_gateway", (front.id,))
    assert worker.actions.get().deployment is None
