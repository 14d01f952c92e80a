"""A resource fault loads a real host, which every node of a simulated fleet shares: a run that would put one on a
simulated node (label simulated=true) is a 400 naming the fault, with nothing started; and the agent of a simulated
fleet refuses one itself, should a message reach it anyway."""
from __future__ import annotations

import time

import pytest

from controlplane.agent import fault_holds, faults, runtime
from controlplane.chaos.models import ChaosRun
from controlplane.chaos.services import experiment_create, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionStatus


@pytest.mark.django_db
@pytest.mark.parametrize("fault", [{"kind": "cpu_hog", "workers": 1}, {"kind": "memory_pressure", "mib": 16},
                                   {"kind": "disk_fill", "max_mib": 8}])
def test_a_run_of_a_resource_fault_on_a_simulated_node_is_a_400_that_starts_nothing(
        world, admin, operator, online_node, fault):
    online_node.labels = {**(online_node.labels or {}), "simulated": "true"}
    online_node.save(update_fields=["labels"])
    experiment = experiment_create(
        deployment=world["deployment"], actor=admin, name="hog", target={"role": "decode", "count": 1},
        faults=[{"kind": "pause"}, fault], duration_s=30,
        hypothesis=[{"metric": "ready_workers", "role": "decode", "min": 1}], abort_conditions=[])
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=experiment, actor=operator)
    assert refused.value.status == 400 and refused.value.extra["field"] == "faults[1].kind"
    assert "simulated" in refused.value.message and online_node.name in refused.value.message
    assert not ChaosRun.objects.exists() and fault_holds.paused_keys() == []


@pytest.mark.django_db
def test_the_agent_of_a_simulated_fleet_refuses_a_resource_fault(world, monkeypatch):
    monkeypatch.setattr(runtime, "simulated", True)
    outcome = faults.fault_inject(key="sim-hog", kind="cpu_hog", worker_id=world["decode"].pk,
                                  until=time.time() + 30, audit={"chaos_run": 1}, params={"workers": 1})
    assert outcome == "unsupported" and fault_holds.paused_keys() == []
    injected = Action.objects.get(idempotency_key=faults.injected_key("sim-hog"))
    assert injected.status == ActionStatus.FAILED and "simulated fleet" in injected.result["error"]
