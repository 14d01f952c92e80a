"""A kind of alert action is declared once, in action_kinds.ALERT_ACTIONS: rule validation, the dispatcher, the
Alertmanager mapping and the help of the API and the rule form all take a new entry from there."""
from __future__ import annotations

import pytest

from controlplane.alerting.services import action_kinds, carry_out
from controlplane.alerting.services.action_kinds import DEPLOYMENT, AlertActionKind, Param
from controlplane.alerting.services.rules import validate_actions
from controlplane.errors import ControlPlaneError, invalid
from controlplane.services import Actor

pytestmark = pytest.mark.django_db


def _minutes(value, where):
    if not isinstance(value, int) or value < 1:
        raise invalid(f"{where} must be a positive number of minutes", field=where)
    return value


@pytest.fixture
def pause(monkeypatch):
    calls = []
    kind = AlertActionKind("pause", "pause the deployment", DEPLOYMENT, lambda call: calls.append(call) or "row",
                           params=(Param("minutes", _minutes, default=5),), inbound={"pause_now": {}})
    monkeypatch.setitem(action_kinds.ALERT_ACTIONS, "pause", kind)
    monkeypatch.setitem(action_kinds.INBOUND, "pause_now", (kind, {}))
    return calls


def test_a_kind_declared_once_is_validated_dispatched_and_offered(pause, deployment):
    assert validate_actions([{"type": "pause"}], role="", per_worker=False) == [{"type": "pause", "minutes": 5}]
    with pytest.raises(ControlPlaneError, match=r"actions\[0\]\.minutes must be a positive number"):
        validate_actions([{"type": "pause", "minutes": 0}], role="", per_worker=False)
    with pytest.raises(ControlPlaneError, match=r"actions\[0\] \(pause\) has unknown keys \['step'\]"):
        validate_actions([{"type": "pause", "step": 1}], role="", per_worker=False)

    outcome = carry_out.alert_action_carry_out(kind="pause", deployment=deployment, actor=Actor.rule("r"),
                                               reason="why", idempotency_key="k")
    assert (outcome.status, outcome.action) == (carry_out.DONE, "row")
    assert pause[0].params == {"minutes": 5} and pause[0].deployment == deployment
    assert "pause (minutes): pause the deployment" in action_kinds.actions_help()
    assert "pause_now" in action_kinds.INBOUND
