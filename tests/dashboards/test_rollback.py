"""Rollback from the revisions page: a confirmation that says which workers of which pools are replaced and what
changes, then deployment_rollback."""
from __future__ import annotations

import pytest

from controlplane.models import Action

pytestmark = pytest.mark.django_db


def test_the_confirmation_lists_the_workers_to_replace_and_the_diff(client_for, operator, deployment,
                                                                   second_revision, make_worker):
    prefill = make_worker(deployment, "prefill")  # revision 2 (current)
    decode = make_worker(deployment, "decode")
    html = client_for(operator).get("/deployments/demo/rollback/1/").content.decode()
    assert "Roll back" in html and "revision #1" in html
    assert "Workers that will be replaced (2)" in html
    assert f"#{prefill.pk} ready · rev #2" in html and f"#{decode.pk} ready · rev #2" in html
    assert "common.threads" in html  # revision 2 set threads=2
    assert not Action.objects.filter(kind="rollback").exists()  # nothing happens before the confirmation


def test_the_confirmation_says_the_new_workers_start_together_and_the_old_drain_once_all_are_ready(
        client_for, operator, deployment, second_revision, make_worker):
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    html = " ".join(client_for(operator).get("/deployments/demo/rollback/1/").content.decode().split())
    # supervision/reconcile.py creates every missing current-revision worker in one pass and drains the old ones
    # once the new group is complete: nothing happens one worker at a time.
    assert "one at a time" not in html
    assert "starts all 2 of its workers at once, in every pool" in html
    assert "until every pool has its desired number of ready #1 workers" in html
    assert "the old workers are drained and stopped together" in html


def test_confirming_rolls_back_and_records_the_action(client_for, operator, deployment, second_revision):
    response = client_for(operator).post("/deployments/demo/rollback/1/", {"reason": "p99 regression"},
                                         follow=True)
    deployment.refresh_from_db()
    assert deployment.current_revision.number == 1
    action = Action.objects.get(kind="rollback")
    assert action.reason == "dashboard: p99 regression" and action.status == "running"
    assert response.request["PATH_INFO"] == "/deployments/demo/"
    assert "Rollout in progress: rollback to revision 1" in response.content.decode()


def test_a_rollback_to_the_current_revision_is_a_message(client_for, operator, deployment, second_revision):
    response = client_for(operator).post("/deployments/demo/rollback/2/", follow=True)
    assert response.status_code == 200
    assert "revision 2 is already the current revision" in response.content.decode()


def test_a_rollback_during_another_rollout_preempts_it(client_for, operator, deployment, second_revision):
    client = client_for(operator)
    client.post("/deployments/demo/rollback/1/")
    response = client.post("/deployments/demo/rollback/2/", follow=True)
    assert response.status_code == 200 and 'class="msg error"' not in response.content.decode()
    first, second = Action.objects.filter(kind="rollback").order_by("id")
    assert first.status == "failed" and second.params["preempted"]["action"] == first.pk


def test_an_unknown_revision_is_404_and_viewers_are_refused(client_for, viewer, operator, deployment):
    assert client_for(operator).get("/deployments/demo/rollback/7/").status_code == 404
    assert client_for(operator).get(f"/deployments/demo/rollback/{2**64}/").status_code == 404
    assert client_for(viewer).post("/deployments/demo/rollback/1/").status_code == 403
