"""Migration 0021 gives the node agent's fault rows a kind of their own: stored `start`/`stop` rows of an injected or
reverted fault become `fault`; a run's own start and stop rows stay what they were."""
from __future__ import annotations

import pytest

from tests.controlplane.migrations import migrations_restored

BEFORE = [("controlplane", "0020_revision_model_checksum")]
AFTER = [("controlplane", "0021_action_kind_fault")]


@pytest.mark.django_db(transaction=True)
def test_stored_fault_rows_become_fault_rows_and_the_others_keep_their_kind():
    with migrations_restored() as migrate:
        Action = migrate(BEFORE).get_model("controlplane", "Action")
        rows = {event: Action.objects.create(kind=kind, actor_type="system", actor="node agent gpu-1",
                                             params={"event": event, "fault": "pause"}).pk
                for event, kind in (("fault_injected", "start"), ("fault_reverted", "stop"),
                                    ("chaos_started", "start"), ("chaos_finished", "stop"))}

        Action = migrate(AFTER).get_model("controlplane", "Action")
        kinds = {event: Action.objects.get(pk=pk).kind for event, pk in rows.items()}
        assert kinds == {"fault_injected": "fault", "fault_reverted": "fault", "chaos_started": "start",
                         "chaos_finished": "stop"}

        Action = migrate(BEFORE).get_model("controlplane", "Action")
        assert Action.objects.get(pk=rows["fault_reverted"]).kind == "stop"
