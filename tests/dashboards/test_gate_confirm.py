"""The change gate holds on the pages too: a scale or an autoscaler switch that the deployment's gate predicts falls
short of its objectives shows the prediction and changes nothing; "Apply anyway" posts the same form acknowledged,
and then it is applied as the operator's own action."""
from __future__ import annotations

import re

import pytest

from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Action, Deployment, Pool
from controlplane.replay.gate import gate_set
from controlplane.replay.models import Trace, TraceRequest
from tests.dashboards.what_if_fleet import profile_with_peak_trace

pytestmark = pytest.mark.django_db
SCALE = "/deployments/demo/pools/decode/scale"


@pytest.fixture
def gated(deployment):
    """`demo` profiled, 2 decode workers carrying a recorded peak that one cannot, its gate on."""
    fleet = profile_with_peak_trace(deployment)
    recorded = Trace.objects.create(deployment=fleet, name="recorded", start=Trace.objects.get(name="peak").start)
    TraceRequest.objects.filter(trace__name="peak").update(trace=recorded)
    gate_set(fleet, enabled=True)
    return fleet


def _confirm_form(response) -> dict:
    text = response.content.decode()
    assert response.status_code == 200 and 'data-testid="gate-prediction"' in text, text[:2000]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', text))


def _decode(fleet) -> int:
    return Pool.objects.get(deployment=fleet, role="decode").desired_replicas


def test_a_scale_the_gate_refuses_waits_for_the_operator_to_confirm_it(client_for, operator, gated):
    client = client_for(operator)
    form = _confirm_form(client.post(SCALE, {"op": "down", "reason": "night"}))
    assert _decode(gated) == 2 and not Action.objects.filter(kind="scale").exists()  # nothing applied
    assert (form["op"], form["reason"], form["acknowledge_prediction"]) == ("down", "night", "1")

    done = client.post(SCALE, form, follow=True)
    assert done.status_code == 200 and _decode(gated) == 1
    assert Action.objects.get(kind="scale").reason.startswith("dashboard: night")

    # More workers: the gate has nothing to object to, and no page stops the operator.
    assert client.post(SCALE, {"op": "set", "replicas": "3"}).status_code == 302 and _decode(gated) == 3


def test_turning_off_an_autoscaler_the_peak_needs_is_confirmed_first(client_for, operator, gated, settings):
    settings.TANDEM_REPLAY_STARTUP_S = 5
    Pool.objects.filter(deployment=gated, role="decode").update(desired_replicas=1)
    Deployment.objects.filter(pk=gated.pk).update(autoscale_enabled=True)
    AutoscalingPolicy.objects.update_or_create(pool=Pool.objects.get(deployment=gated, role="decode"), defaults={
        "enabled": True, "metric": "requests_running_per_worker", "target": 8})
    client = client_for(operator)
    form = _confirm_form(client.post("/deployments/demo/autoscaling", {"enabled": "off"}))
    assert Deployment.objects.get(pk=gated.pk).autoscale_enabled is True
    client.post("/deployments/demo/autoscaling", form)
    assert Deployment.objects.get(pk=gated.pk).autoscale_enabled is False
