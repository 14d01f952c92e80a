"""The chaos card's forms: an admin opts the deployment in or out and creates an experiment from a built-in
template; an operator runs an existing experiment (to its live report). Each calls the API's service: a refusal is
the API's message on the page (never a 500, nothing half-made), and a role too low is a 403."""
from __future__ import annotations

import time

import pytest
from django.test import Client

from controlplane.chaos.models import ChaosRun, ChaosSettings, Experiment
from controlplane.models import Action
from tests.controlplane.chaos.test_driver import steady_history

PAGE = "/deployments/demo/"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.mark.django_db
def test_an_admin_creates_an_experiment_from_a_template(deployment, admin, operator):
    client = signed_in(admin)
    html = client.get(PAGE).content.decode()
    assert 'id="chaos-template-form"' in html and '<option value="decode-hang"' in html
    response = client.post("/deployments/demo/chaos/experiments",
                           {"template": "decode-hang", "name": "", "role": "", "count": "1", "duration_s": "20"},
                           follow=True)
    assert response.status_code == 200
    assert messages_of(response) == ["Experiment decode-hang created: 1 fault(s) on decode for 20 s."]
    experiment = Experiment.objects.get()
    assert (experiment.name, experiment.target, experiment.faults, experiment.duration_s) == (
        "decode-hang", {"role": "decode", "count": 1}, [{"kind": "pause"}], 20.0)
    assert {"metric": "ready_workers", "role": "decode", "min": 1.0} in experiment.hypothesis
    assert experiment.created_by == admin

    # Another role and the template's duration; the card lists it.
    client.post("/deployments/demo/chaos/experiments",
                {"template": "prefill-errors", "name": "bad-prefill", "role": "prefill", "count": "1"})
    made = Experiment.objects.get(name="bad-prefill")
    assert made.target["role"] == "prefill" and made.duration_s == 60.0
    assert 'data-experiment="bad-prefill"' in client.get(PAGE).content.decode()

    assert signed_in(operator).post("/deployments/demo/chaos/experiments",
                                    {"template": "decode-kill"}).status_code == 403
    assert Experiment.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("fields, message", [
    ({"template": "no-such"}, "template 'no-such' is not a built-in template"),
    ({"template": "decode-kill", "duration_s": "99999"}, "duration_s must be a number in 1..600, not 99999"),
    ({"template": "decode-kill", "duration_s": "0"}, "duration_s must be a number in 1..600, not 0"),
    ({"template": "decode-kill", "duration_s": "soon"}, "duration_s must be a number in 1..600, not 'soon'"),
    ({"template": "decode-kill", "count": "-2"}, "target.count must be an integer in 1..64, not -2"),
    ({"template": "decode-kill", "role": "colocated"}, "target.role 'colocated' is not a role of this deployment"),
    ({"template": "decode-kill", "name": "Bad Name"}, "name 'Bad Name' must be 1-63 lowercase letters"),
])
def test_bad_input_is_the_apis_message_on_the_page(deployment, admin, fields, message):
    response = signed_in(admin).post("/deployments/demo/chaos/experiments", fields, follow=True)
    assert response.status_code == 200
    assert messages_of(response)[0].startswith(message)
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_a_taken_name_is_refused_on_the_page(deployment, admin):
    client = signed_in(admin)
    client.post("/deployments/demo/chaos/experiments", {"template": "decode-kill"})
    response = client.post("/deployments/demo/chaos/experiments", {"template": "decode-kill"}, follow=True)
    assert messages_of(response)[-1] == "deployment 'demo' already has an experiment named 'decode-kill'"
    assert Experiment.objects.count() == 1


@pytest.mark.django_db
def test_an_admin_toggles_the_opt_in_and_an_operator_may_not(deployment, admin, operator):
    client = signed_in(admin)
    assert 'data-testid="chaos-opt-in">Opt in' in client.get(PAGE).content.decode()
    response = client.post("/deployments/demo/chaos/opt-in", {"enabled": "on"}, follow=True)
    assert messages_of(response) == ["Chaos experiments on demo: opted in."]
    assert ChaosSettings.objects.get(deployment=deployment).enabled is True
    assert Action.objects.get(params__event="chaos_enabled").actor == admin.username
    assert 'data-testid="chaos-opt-in">Opt out' in response.content.decode()
    assert messages_of(client.post("/deployments/demo/chaos/opt-in", {"enabled": "maybe"}, follow=True)) == [
        "enabled must be on or off"]
    assert signed_in(operator).post("/deployments/demo/chaos/opt-in", {"enabled": "off"}).status_code == 403
    assert 'data-testid="chaos-opt-in"' not in signed_in(operator).get(PAGE).content.decode()
    client.post("/deployments/demo/chaos/opt-in", {"enabled": "off"})
    assert ChaosSettings.objects.get(deployment=deployment).enabled is False


@pytest.mark.django_db
def test_an_operator_runs_an_experiment_and_lands_on_its_live_report(
        experiment, gateway, operator, viewer, agent_inline, django_capture_on_commit_callbacks):
    client = signed_in(operator)
    # Not steady yet (no gateway history): the API's 409 message, and no run.
    response = client.post("/deployments/demo/chaos/run", {"experiment": "pause-decode"}, follow=True)
    assert messages_of(response)[0].startswith("the system is not in steady state: error_ratio: no data")
    assert not ChaosRun.objects.exists()
    assert messages_of(client.post("/deployments/demo/chaos/run", {"experiment": "nope"}, follow=True)) == [
        "deployment 'demo' has no chaos experiment 'nope'"]
    assert signed_in(viewer).post("/deployments/demo/chaos/run", {"experiment": "pause-decode"}).status_code == 403
    assert 'data-testid="chaos-run-pause-decode"' in client.get(PAGE).content.decode()
    assert 'data-testid="chaos-run-pause-decode"' not in signed_in(viewer).get(PAGE).content.decode()

    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/deployments/demo/chaos/run", {"experiment": "pause-decode"})
    run = ChaosRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/deployments/demo/chaos/runs/{run.pk}"
    assert run.created_by == operator
    # While it runs the card offers no second run; a second POST is the API's 409.
    assert 'data-testid="chaos-run-pause-decode"' not in client.get(PAGE).content.decode()
    again = client.post("/deployments/demo/chaos/run", {"experiment": "pause-decode"}, follow=True)
    assert messages_of(again) == ["a chaos run of 'demo' is active: one at a time"]
    assert ChaosRun.objects.count() == 1


@pytest.mark.django_db
def test_an_admin_creates_an_experiment_on_one_node(deployment, admin, make_worker):
    from controlplane.models import Node

    other = Node.objects.create(name="gpu-2", hostname="gpu-2.example", queue=Node.queue_for("gpu-2"))
    make_worker(deployment, "decode", node=other)
    make_worker(deployment, "prefill")  # on `local`: no decode worker there
    Node.objects.create(name="idle", hostname="idle.example", queue=Node.queue_for("idle"))
    client = signed_in(admin)
    html = client.get(PAGE).content.decode()
    # The nodes that run a worker of the deployment, and no other.
    assert '<select name="node"><option value="">any</option><option value="gpu-2">gpu-2</option>' \
           '<option value="local">local</option></select>' in html
    response = client.post("/deployments/demo/chaos/experiments",
                           {"template": "decode-hang", "name": "hang-gpu-2", "role": "", "count": "1",
                            "node": "gpu-2"}, follow=True)
    assert messages_of(response) == ["Experiment hang-gpu-2 created: 1 fault(s) on decode on node gpu-2 for 30 s."]
    assert Experiment.objects.get().target == {"role": "decode", "count": 1, "node": "gpu-2"}
    assert '<code data-target-node>gpu-2</code>' in response.content.decode()

    for node, message in (("local", "target.node 'local' runs no decode worker of deployment 'demo'"),
                          ("idle", "target.node 'idle' runs no decode worker of deployment 'demo'"),
                          ("nowhere", "target.node 'nowhere' is not a registered node")):
        response = client.post("/deployments/demo/chaos/experiments",
                               {"template": "decode-hang", "name": f"hang-{node}", "node": node}, follow=True)
        assert response.status_code == 200 and messages_of(response)[0].startswith(message)
    assert Experiment.objects.count() == 1
