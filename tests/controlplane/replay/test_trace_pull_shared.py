"""A shared gateway is pulled once per deployment it serves (`/trace?deployment=NAME`), each page into that
deployment's recorded trace, with a cursor per (gateway, deployment): its rings are numbered each on its own."""
from __future__ import annotations

import pytest

from controlplane.models import Deployment, SharedGateway, Worker, WorkerRole, WorkerStatus
from controlplane.replay.ingest import _gateways
from controlplane.replay.models import TraceCursor, TraceRequest
from controlplane.replay.services import recorded_trace, store_page

pytestmark = pytest.mark.django_db


@pytest.fixture
def front(deployment, make_deployment, node):
    gateway = SharedGateway.objects.create(name="front", port=41700, node=node)
    other = make_deployment("other")
    Deployment.objects.filter(pk__in=[deployment.pk, other.pk]).update(shared_gateway=gateway, gateway_port=None)
    worker = Worker.objects.create(shared_gateway=gateway, role=WorkerRole.GATEWAY, node=node, port=41700,
                                   status=WorkerStatus.READY)
    return worker, other


def _page(seqs):
    return {"started": 1000.0, "last": max(seqs), "records": [
        {"seq": seq, "t": 1000.0 + seq, "outcome": "ok", "prompt_tokens": 4, "completion_tokens": 2}
        for seq in seqs]}


def test_each_deployment_of_a_shared_gateway_is_pulled_with_its_name(front, deployment):
    worker, other = front
    pulls = sorted(_gateways())
    assert pulls == sorted([(worker.id, deployment.pk, "http://127.0.0.1:41700/trace?deployment=demo&"),
                            (worker.id, other.pk, "http://127.0.0.1:41700/trace?deployment=other&")])


def test_each_deployments_records_land_in_its_own_trace_with_its_own_cursor(front, deployment):
    worker, other = front
    mine, theirs = recorded_trace(deployment), recorded_trace(other)
    store_page(mine, worker.id, _page([1, 2, 3]))
    store_page(theirs, worker.id, _page([1, 2]))  # the same numbers, another ring: nothing skipped
    assert TraceRequest.objects.filter(trace=mine).count() == 3
    assert TraceRequest.objects.filter(trace=theirs).count() == 2
    cursors = dict(TraceCursor.objects.filter(gateway_id=worker.id).values_list("deployment_id", "last"))
    assert cursors == {deployment.pk: 3, other.pk: 2}
