"""Placement: a pool's workers go only to online nodes whose labels match its selector and that have room for its
per-worker request, spread across those nodes; when none fits, the pool says `unschedulable` and why, with an
audit row, and recovers (another row) once a node fits. Two node rows stand in for two hosts."""
from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.models import Action, Node, Pool, Worker
from controlplane.supervision.placement import placement_for

pytestmark = pytest.mark.django_db


def _node(name, *, labels=None, gpus=0, cpus=8):
    return Node.objects.create(
        name=name, last_seen_at=timezone.now(), labels=labels or {},
        gpus=[{"index": i, "name": "NVIDIA H200", "memory_total_bytes": 141 << 30} for i in range(gpus)],
        detected_labels={"cpu.count": str(cpus), "gpu.count": str(gpus)})


def _pool(deployment, role, **fields):
    Pool.objects.filter(deployment=deployment, role=role).update(**fields)
    return Pool.objects.get(deployment=deployment, role=role)


def test_a_selector_picks_only_matching_nodes(deployment):
    _node("cpu-box", labels={"class": "compute"})
    bandwidth = _node("hbm-box", labels={"class": "bandwidth"})
    pool = _pool(deployment, "decode", node_selector={"class": "bandwidth"})
    assert placement_for(pool).node == bandwidth


def test_no_matching_node_says_which_labels_are_missing(deployment):
    _node("cpu-box", labels={"class": "compute"})
    pool = _pool(deployment, "decode", node_selector={"class": "bandwidth"})
    placement = placement_for(pool)
    assert placement.node is None and placement.reason == "no online node matches class=bandwidth"


def test_a_gpu_is_one_workers_own_unless_the_pool_allows_sharing(deployment, make_worker):
    node = _node("gpu-box", labels={"class": "bandwidth"}, gpus=1)
    pool = _pool(deployment, "decode", node_selector={"class": "bandwidth"}, gpus_per_worker=1)
    assert placement_for(pool).node == node
    make_worker(deployment, "decode", node=node)
    placement = placement_for(pool)
    assert placement.node is None
    assert placement.reason == "no online node matches class=bandwidth with 1 free GPU"
    pool = _pool(deployment, "decode", allow_gpu_sharing=True)
    assert placement_for(pool).node == node


def test_cpu_threads_are_accounted_against_the_nodes_cpu_count(deployment, make_worker):
    node = _node("small", cpus=2)
    pool = _pool(deployment, "prefill", threads_per_worker=2)
    assert placement_for(pool).node == node
    make_worker(deployment, "prefill", node=node)
    assert placement_for(pool).reason == "no online node is up with 2 free CPU threads"


def test_a_pools_workers_spread_across_matching_nodes(deployment, make_worker):
    a = _node("a", labels={"class": "compute"})
    b = _node("b", labels={"class": "compute"})
    pool = _pool(deployment, "prefill", node_selector={"class": "compute"})
    make_worker(deployment, "prefill", node=a)
    make_worker(deployment, "decode", node=b)  # another pool's worker does not count for the spread
    make_worker(deployment, "decode", node=b)
    assert placement_for(pool).node == b


def test_a_scale_beyond_capacity_places_what_fits_and_reports_the_rest(deployment, operator, sent, reconcile):
    from controlplane.services import pool_scale

    _node("gpu-box", labels={"class": "bandwidth"}, gpus=2)
    _node("gateway-box", labels={"class": "compute"})
    _pool(deployment, "decode", node_selector={"class": "bandwidth"}, gpus_per_worker=1)
    pool_scale(deployment=deployment, role="decode", replicas=3, actor=operator)
    reconcile(deployment)
    pool = Pool.objects.get(deployment=deployment, role="decode")
    assert Worker.objects.filter(pool=pool).count() == 2  # desired state accepted; two fit
    assert pool.status == "unschedulable"
    assert pool.unschedulable_reason == ("1 of 3 workers cannot be placed: no online node matches class=bandwidth "
                                         "with 1 free GPU")
    audit, = Action.objects.filter(kind="unschedulable")
    assert audit.actor_type == "system" and audit.params == {"role": "decode", "num_unplaced": 1, "desired": 3}
    reconcile(deployment)
    assert Action.objects.filter(kind="unschedulable").count() == 1  # said once, not every pass

    pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator)
    reconcile(deployment)
    pool.refresh_from_db()
    assert pool.status == "ok"
    recovered = Action.objects.filter(kind="unschedulable").order_by("-id").first()
    assert recovered.reason == "decode pool: every worker placed again"
