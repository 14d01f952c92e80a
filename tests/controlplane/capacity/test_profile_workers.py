"""A profile run's workers are the node agent's like any other (a start and a stop on the node's queue), but no
deployment counts them as serving: out of the gateway's membership, out of the scrape, out of reconcile's pool
counts. The run places them on a node of the class, preferring one without the deployment's serving workers, and
refuses one with them unless allowed."""
import pytest

from controlplane.capacity.selectors import profile_placement
from controlplane.capacity.services.profile_jobs import profile_run
from controlplane.errors import ControlPlaneError
from controlplane.models import Node, Worker
from controlplane.observability.store import scrape_targets
from controlplane.selectors import deployment_endpoints
from controlplane.supervision.profile_workers import profile_worker_start, profile_workers_stop
from controlplane.supervision.reconcile import reconcile_deployment


def test_a_profile_worker_is_started_by_its_node_agent_and_never_serves(deployment, online_node, make_worker, sent,
                                                                       django_capture_on_commit_callbacks):
    serving = make_worker(deployment, "decode")
    make_worker(deployment, "prefill")
    with django_capture_on_commit_callbacks(execute=True):
        worker = profile_worker_start(deployment=deployment, revision=deployment.current_revision, role="decode",
                                      node=online_node)
    assert worker.purpose == "profile" and worker.pool is None and worker.status == "pending"
    assert sent == [("agent_start_worker", (worker.pk,), online_node.queue)]
    Worker.objects.filter(pk=worker.pk).update(status="ready", port=45999, pid=45999)
    assert deployment_endpoints(deployment)["groups"][0]["decode"] == [serving.url]
    assert worker.pk not in {target.worker_id for target in scrape_targets()}
    assert serving.pk in {target.worker_id for target in scrape_targets()}
    summary = reconcile_deployment(deployment.pk)  # the pools have their one worker each: nothing to add or drain
    assert set(Worker.objects.filter(pk__in=summary["created"]).values_list("role", flat=True)) <= {"gateway"}
    assert summary["drained"] == [] and Worker.objects.get(pk=worker.pk).status == "ready"


def test_stopping_profile_workers_goes_through_their_agent(deployment, online_node, sent,
                                                           django_capture_on_commit_callbacks):
    pending = profile_worker_start(deployment=deployment, revision=deployment.current_revision, role="prefill",
                                   node=online_node)
    ready = profile_worker_start(deployment=deployment, revision=deployment.current_revision, role="decode",
                                 node=online_node)
    Worker.objects.filter(pk=ready.pk).update(status="ready", port=45998, pid=45998)
    with django_capture_on_commit_callbacks(execute=True):
        assert sorted(profile_workers_stop(deployment=deployment, reason="done")) == sorted([pending.pk, ready.pk])
    assert Worker.objects.get(pk=pending.pk).status == "stopped"  # no process yet: nothing for the agent to do
    assert Worker.objects.get(pk=ready.pk).status == "draining"
    assert [(name, args[0], queue) for name, args, queue in sent] == [("agent_stop_worker", ready.pk,
                                                                       online_node.queue)]


def test_placement_prefers_a_node_of_the_class_without_serving_workers(deployment, make_worker):
    from django.utils import timezone

    busy = Node.objects.create(name="busy", labels={"class": "bandwidth"}, last_seen_at=timezone.now())
    free = Node.objects.create(name="free", labels={"class": "bandwidth"}, last_seen_at=timezone.now())
    Node.objects.create(name="other", labels={"class": "compute"}, last_seen_at=timezone.now())
    make_worker(deployment, "decode", node=busy)
    assert profile_placement(deployment, "decode", "bandwidth").node == free
    free.delete()
    placement = profile_placement(deployment, "decode", "bandwidth")
    assert placement.node == busy and placement.num_serving == 1


def test_a_run_refuses_a_node_with_serving_workers_and_says_so(deployment, online_node, make_worker):
    make_worker(deployment, "decode")
    with pytest.raises(ControlPlaneError, match="disturb production traffic"):
        profile_run(deployment=deployment, quick=True)
    assert not Worker.objects.filter(purpose="profile").exists()


def test_a_run_without_an_online_node_of_the_class_says_which(deployment):
    from controlplane.capacity.load_driver import ProfileError

    with pytest.raises(ProfileError, match="no online node matches class=gpu"):
        profile_run(deployment=deployment, quick=True, node_class="gpu")
