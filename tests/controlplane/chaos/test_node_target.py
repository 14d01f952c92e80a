"""A node as an experiment's target: {"node": name} picks the deployment's ready workers on that node only (all of
them, or those role, count, percent or revision narrow it to); a node-level fault (cpu_hog, memory_pressure,
disk_fill, agent_kill) is sent once per node of the targets, to that node's agent; an unknown node, or one that runs
no worker of the deployment (of the role), is a 400 naming target.node with nothing created, and a node that has
none ready by the run's start a 409 with no run; the Chaos Toolkit export carries the node and imports back."""
from __future__ import annotations

import copy

import pytest

from controlplane.chaos.models import ChaosRun, Experiment
from controlplane.chaos.services import experiment_create, experiment_update, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Node, Worker

BASE = "/api/v1/deployments/demo/chaos"
# Read from Worker rows: holds with no gateway traffic, so a run starts on these rows alone.
READY_DECODE = [{"metric": "ready_workers", "role": "decode", "min": 1}]


@pytest.fixture
def second_node(world, make_worker):
    """Node `gpu-2` (online) with two ready decode workers and a ready prefill worker of `demo`; `local` (world's
    node) keeps its prefill, decode and gateway workers."""
    from django.utils import timezone

    node = Node.objects.create(name="gpu-2", hostname="gpu-2.example", queue=Node.queue_for("gpu-2"),
                               last_seen_at=timezone.now())
    deployment = world["deployment"]
    node.made = [make_worker(deployment, "decode", node=node).pk, make_worker(deployment, "decode", node=node).pk,
                 make_worker(deployment, "prefill", node=node).pk]
    return node


def _run(world, admin, operator, *, target: dict, faults: list[dict], name: str = "on-a-node") -> ChaosRun:
    experiment = experiment_create(deployment=world["deployment"], actor=admin, name=name, target=target,
                                   faults=faults, duration_s=5, hypothesis=READY_DECODE)
    return run_start(experiment=experiment, actor=operator)


@pytest.mark.django_db
@pytest.mark.parametrize("target, roles", [
    ({"node": "gpu-2"}, ["decode", "decode", "prefill"]),
    ({"node": "gpu-2", "role": "decode"}, ["decode", "decode"]),
    ({"node": "gpu-2", "role": "decode", "count": 1}, ["decode"]),
    ({"node": "gpu-2", "percent": 50}, None),  # 2 of its 3, whichever
])
def test_a_node_target_picks_only_that_nodes_workers(world, admin, operator, second_node, target, roles):
    elsewhere = set(Worker.objects.exclude(node=second_node).values_list("pk", flat=True))
    assert len(elsewhere) == 3  # world's prefill, decode and gateway on `local`
    for attempt in range(5):  # the pick is random: each time, only gpu-2's
        run = _run(world, admin, operator, target=target, faults=[{"kind": "pause"}], name=f"node-{attempt}")
        assert {t["node"] for t in run.targets} == {"gpu-2"}
        assert {t["worker"] for t in run.targets} <= set(second_node.made)
        assert not {f["worker"] for f in run.faults} & elsewhere
        assert {f["queue"] for f in run.faults} == {second_node.queue}
        if roles is not None:
            assert sorted(t["role"] for t in run.targets) == roles
        else:
            assert len(run.targets) == 2
        ChaosRun.objects.filter(pk=run.pk).update(status="finished")


@pytest.mark.django_db
@pytest.mark.parametrize("fault", [{"kind": "cpu_hog", "workers": 2}, {"kind": "memory_pressure", "mib": 16},
                                   {"kind": "disk_fill", "max_mib": 8}, {"kind": "agent_kill"}])
def test_a_node_level_fault_goes_once_per_node_of_its_targets(world, admin, operator, online_node, second_node,
                                                              fault):
    # Three decode workers on two nodes: one message per node.
    run = _run(world, admin, operator, target={"role": "decode", "percent": 100}, faults=[fault, {"kind": "pause"}])
    assert len(run.targets) == 3
    node_level = [f for f in run.faults if f["kind"] == fault["kind"]]
    assert sorted(f["queue"] for f in node_level) == sorted([online_node.queue, second_node.queue])
    assert len([f for f in run.faults if f["kind"] == "pause"]) == 3  # a worker's fault: on each
    ChaosRun.objects.filter(pk=run.pk).update(status="finished")

    # Two decode workers on one node: one message, to that node's agent, with the fault's own settings.
    run = _run(world, admin, operator, target={"node": "gpu-2", "role": "decode"}, faults=[fault], name="one-node")
    assert len(run.targets) == 2
    [sent] = run.faults
    assert (sent["kind"], sent["queue"], sent["worker"] in second_node.made) == (fault["kind"], second_node.queue,
                                                                                True)
    assert {key: sent["params"][key] for key in fault if key != "kind"} == {
        key: value for key, value in fault.items() if key != "kind"}


@pytest.mark.django_db
@pytest.mark.parametrize("target, field, message", [
    ({"node": "nowhere"}, "target.node", "target.node 'nowhere' is not a registered node; nodes: gpu-2, idle, local"),
    ({"node": "idle"}, "target.node", "target.node 'idle' runs no worker of deployment 'demo'"),
    ({"node": "gpu-2", "role": "colocated"}, "target.role", "target.role 'colocated' is not a role"),
    ({"node": "local", "role": "decode", "revision": 2}, "target.node",
     "target.node 'local' runs no decode revision 2 worker of deployment 'demo'"),
    ({"node": 7}, "target.node", "target.node 7 must be a node's name"),
    ({"node": ""}, "target.node", "target.node '' must be a node's name"),
    ({"node": "Not A Node"}, "target.node", "target.node 'Not A Node' is not a registered node"),
    ({"node": "gpu-2", "count": 1, "percent": 50}, "target.percent", "target takes count or percent"),
])
def test_a_bad_node_target_is_a_400_naming_it_and_creates_nothing(world, second_node, admin_api, target, field,
                                                                  message):
    Node.objects.create(name="idle", hostname="idle.example", queue=Node.queue_for("idle"))
    response = admin_api.post(f"{BASE}/experiments", {"name": "bad", "target": target, "faults": [{"kind": "kill"}],
                                                      "duration_s": 5, "hypothesis": READY_DECODE}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and error["message"].startswith(message), error
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_a_node_with_only_prefill_workers_is_no_target_for_decode_or_kv_faults(world, admin, admin_api,
                                                                               make_worker):
    only_prefill = Node.objects.create(name="cpu-1", hostname="cpu-1.example", queue=Node.queue_for("cpu-1"))
    make_worker(world["deployment"], "prefill", node=only_prefill)
    new = {"name": "kv", "faults": [{"kind": "kv_latency", "ms": 50}], "duration_s": 5, "hypothesis": READY_DECODE}
    response = admin_api.post(f"{BASE}/experiments", {**new, "target": {"node": "cpu-1"}}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "faults[0].kind", response.content
    assert "a node target takes one to narrow it" in response.json()["error"]["message"]
    response = admin_api.post(f"{BASE}/experiments", {**new, "target": {"node": "cpu-1", "role": "decode"}},
                              format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "target.node", response.content
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_a_node_without_ready_workers_at_run_start_is_a_409_and_no_run(world, admin, operator, second_node):
    experiment = experiment_create(deployment=world["deployment"], actor=admin, name="gpu-2-decode",
                                   target={"node": "gpu-2", "role": "decode"}, faults=[{"kind": "pause"}],
                                   duration_s=5, hypothesis=READY_DECODE)
    Worker.objects.filter(node=second_node, role="decode").update(status="stopped", pid=None)
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=experiment, actor=operator)
    assert refused.value.status == 409
    assert refused.value.message == ("the decode role of 'demo' has 0 ready worker(s) on node 'gpu-2'; the "
                                     "experiment targets 1")
    assert not ChaosRun.objects.exists()

    # Editing anything else keeps the experiment; a target naming a node without workers is refused.
    assert experiment_update(experiment=experiment, actor=admin, duration_s=7).duration_s == 7
    with pytest.raises(ControlPlaneError) as refused:
        experiment_update(experiment=experiment, actor=admin, target={"node": "gpu-2", "role": "decode",
                                                                      "count": 1})
    assert refused.value.status == 400 and refused.value.extra["field"] == "target.node"
    experiment.refresh_from_db()
    assert experiment.target == {"node": "gpu-2", "role": "decode"}


def _retitled(document: dict, title: str) -> dict:
    """The document as another experiment's: its title and every activity's `experiment` argument."""
    document = copy.deepcopy({**document, "title": title})
    for activity in [*document["steady-state-hypothesis"]["probes"], *document["method"], *document["rollbacks"]]:
        activity["provider"]["arguments"]["experiment"] = title
    return document


@pytest.mark.django_db
def test_the_chaos_toolkit_export_carries_the_node_and_imports_back(world, admin, admin_api, second_node):
    experiment_create(deployment=world["deployment"], actor=admin, name="gpu-2-hog",
                      target={"node": "gpu-2", "role": "decode", "count": 1}, faults=[{"kind": "cpu_hog"}],
                      duration_s=5, hypothesis=READY_DECODE)
    document = admin_api.get(f"{BASE}/experiments/gpu-2-hog/chaostoolkit.json").json()
    [action] = document["method"]
    assert action["provider"]["arguments"]["target"] == {"node": "gpu-2", "role": "decode", "count": 1}

    response = admin_api.post(f"{BASE}/import", _retitled(document, "gpu-2-hog-copy"), format="json")
    assert response.status_code == 201, response.content
    assert Experiment.objects.get(name="gpu-2-hog-copy").target == {"node": "gpu-2", "role": "decode", "count": 1}

    # A node this fleet does not have: the 400 names its place in the document.
    action["provider"]["arguments"]["target"] = {"node": "elsewhere"}
    response = admin_api.post(f"{BASE}/import", _retitled(document, "elsewhere"), format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "method[0].provider.arguments.target.node"
    assert not Experiment.objects.filter(name="elsewhere").exists()
