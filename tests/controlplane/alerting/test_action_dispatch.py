"""One dispatcher turns an alert's action into a service call for rules and Alertmanager alike: done with the
Action row, skipped when there is nothing to do, refused (never raised) when the service says no."""
from __future__ import annotations

import pytest

from controlplane.alerting.services import carry_out
from controlplane.models import Pool
from controlplane.services import Actor

pytestmark = pytest.mark.django_db


def _carry_out(deployment, kind, **kwargs):
    return carry_out.alert_action_carry_out(kind=kind, deployment=deployment, actor=Actor.rule("r"), reason="why",
                                            idempotency_key=f"k-{kind}", **kwargs)


def test_a_scale_is_done_through_the_service(deployment):
    outcome = _carry_out(deployment, "scale", role="decode", params={"direction": "up", "step": 1})
    assert outcome.status == carry_out.DONE and outcome.action.params == {"role": "decode", "from": 1, "to": 2}
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2


def test_a_scale_at_the_bound_or_of_no_pool_is_skipped(deployment):
    outcome = _carry_out(deployment, "scale", role="decode", params={"direction": "down", "step": 1})
    assert (outcome.status, outcome.detail) == (carry_out.SKIPPED, "decode pool already at its min (1 replicas)")
    outcome = _carry_out(deployment, "scale", role="colocated")
    assert (outcome.status, outcome.detail) == (carry_out.SKIPPED, "deployment has no 'colocated' pool to scale")


def test_a_restart_without_a_worker_is_skipped_and_a_refused_rollback_is_refused(deployment):
    assert _carry_out(deployment, "restart").status == carry_out.SKIPPED
    outcome = _carry_out(deployment, "rollback")
    assert outcome.status == carry_out.REFUSED and outcome.action is None and outcome.detail
