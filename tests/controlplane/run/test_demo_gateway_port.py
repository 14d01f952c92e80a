"""A changed TANDEM_GATEWAY_PORT moves the existing demo's gateway (recorded as an action), a gateway still running
is restarted onto the new port, another deployment's port is refused, and failed demo workers get a new try."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Deployment, Worker
from controlplane.run.demo import demo_deployment_ensure
from tests.procs import free_port


@pytest.fixture
def demo(db, settings, model_dir):
    settings.TANDEM_GATEWAY_PORT = free_port()
    deployment, _ = demo_deployment_ensure(model_dir)
    return deployment


def test_a_changed_gateway_port_moves_the_demo_and_says_so(demo, settings, model_dir):
    old, new = demo.gateway_port, free_port()
    settings.TANDEM_GATEWAY_PORT = new
    deployment, what = demo_deployment_ensure(model_dir)
    assert what == f"gateway moved from port {old} to {new} (TANDEM_GATEWAY_PORT)"
    assert deployment.gateway_port == new == Deployment.objects.get(pk=demo.pk).gateway_port
    action = Action.objects.get(kind="restart", deployment=demo, worker=None)
    assert (action.actor_type, action.actor, action.status) == ("system", "tandem_run", "succeeded")
    assert action.params == {"role": "gateway", "from_port": old, "to_port": new}
    assert f"moves from port {old} to {new}" in action.reason
    assert demo_deployment_ensure(model_dir)[1] == "exists"  # once moved, nothing more to do


def test_a_gateway_still_running_is_restarted_onto_the_new_port(demo, settings, model_dir, make_worker):
    gateway = make_worker(demo, "gateway", port=demo.gateway_port)
    settings.TANDEM_GATEWAY_PORT = free_port()
    demo_deployment_ensure(model_dir)
    # Reconcile carries the restart out; the agent starts a gateway on its deployment's gateway_port.
    restart = Action.objects.get(kind="restart", worker=gateway)
    assert restart.status == "pending" and restart.actor == "tandem_run"


def test_another_deployments_port_is_refused(demo, settings, model_dir, make_deployment):
    from controlplane.errors import ControlPlaneError

    other = make_deployment("other")
    settings.TANDEM_GATEWAY_PORT = other.gateway_port
    with pytest.raises(ControlPlaneError, match=f"port {other.gateway_port} is the gateway port of deployment 'other'"):
        demo_deployment_ensure(model_dir)
    assert Deployment.objects.get(pk=demo.pk).gateway_port != other.gateway_port


def test_failed_demo_workers_get_a_new_try(demo, model_dir, make_worker):
    failed_gateway = make_worker(demo, "gateway", status="failed")
    failed_decode = make_worker(demo, "decode", status="failed")
    _, what = demo_deployment_ensure(model_dir)
    assert what == f"failed workers restarted: gateway #{failed_gateway.pk}, decode #{failed_decode.pk}"
    assert set(Action.objects.filter(kind="restart", status="pending").values_list("worker_id", flat=True)) == {
        failed_gateway.pk, failed_decode.pk}
    assert Worker.objects.filter(status="failed").count() == 2  # until reconcile carries the restarts out
