"""One reconcile pass makes each pool's current-revision workers match its desired replicas."""
from __future__ import annotations

from controlplane.models import Node, Worker, WorkerStatus
from django.utils import timezone


def _serving(deployment, role):
    return Worker.objects.filter(deployment=deployment, role=role,
                                 status__in=(WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY))


def test_it_creates_the_missing_workers_and_the_gateway_and_sends_their_starts_to_the_node_queue(
        deployment, online_node, sent, reconcile):
    summary = reconcile(deployment)

    workers = {w.role: w for w in Worker.objects.filter(deployment=deployment)}
    assert set(workers) == {"prefill", "decode", "gateway"}
    assert all(w.status == WorkerStatus.PENDING and w.node == online_node for w in workers.values())
    assert workers["gateway"].port == deployment.gateway_port and workers["gateway"].revision is None
    assert workers["decode"].revision == deployment.current_revision
    assert sorted(summary["created"]) == sorted(summary["started"]) == sorted(w.id for w in workers.values())
    assert sorted(sent) == sorted(("agent_start_worker", (w.id,), "node.local") for w in workers.values())


def test_a_second_pass_creates_and_sends_nothing_more(deployment, online_node, sent, reconcile):
    reconcile(deployment)
    num_sent = len(sent)
    summary = reconcile(deployment)
    assert summary["created"] == summary["started"] == []
    assert len(sent) == num_sent
    assert Worker.objects.filter(deployment=deployment).count() == 3


def test_it_creates_nothing_while_no_node_agent_is_online(deployment, node, sent, reconcile):
    reconcile(deployment)
    assert not Worker.objects.filter(deployment=deployment).exists() and sent == []


def test_it_places_a_new_worker_on_the_least_loaded_online_node(deployment, online_node, make_worker, sent,
                                                                reconcile):
    idle = Node.objects.create(name="idle", last_seen_at=timezone.now())
    Node.objects.create(name="offline", last_seen_at=timezone.now() - timezone.timedelta(minutes=5))
    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    reconcile(deployment)
    decode, = _serving(deployment, "decode")
    assert decode.node == idle
    assert ("agent_start_worker", (decode.id,), "node.idle") in sent


def test_scaling_down_drains_the_newest_ready_worker(deployment, online_node, make_worker, sent, reconcile, admin):
    from controlplane.services import pool_scale

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    pool_scale(deployment=deployment, role="decode", replicas=2, actor=admin)
    oldest, newest = make_worker(deployment, "decode"), make_worker(deployment, "decode")
    pool_scale(deployment=deployment, role="decode", replicas=1, actor=admin)

    summary = reconcile(deployment)

    assert summary["drained"] == [newest.id]
    newest.refresh_from_db()
    oldest.refresh_from_db()
    assert newest.status == WorkerStatus.DRAINING and "scaled decode down to 1" in newest.last_error
    assert oldest.status == WorkerStatus.READY
    assert ("agent_stop_worker", (newest.id, 10), "node.local") in sent


def test_scaling_down_stops_a_pending_worker_before_touching_a_ready_one(deployment, online_node, make_worker,
                                                                        sent, reconcile, admin):
    from controlplane.services import pool_scale

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    pool_scale(deployment=deployment, role="decode", replicas=2, actor=admin)
    ready = make_worker(deployment, "decode")
    pending = Worker.objects.create(deployment=deployment, pool=ready.pool, role="decode", node=online_node,
                                    revision=deployment.current_revision, status=WorkerStatus.PENDING)
    pool_scale(deployment=deployment, role="decode", replicas=1, actor=admin)

    reconcile(deployment)

    pending.refresh_from_db()
    ready.refresh_from_db()
    assert pending.status == WorkerStatus.STOPPED and ready.status == WorkerStatus.READY
    assert not [m for m in sent if m[0] == "agent_stop_worker"]  # nothing ran: no agent needed
