"""Restarting the node agent leaves its worker processes running; the new agent re-adopts them."""
from __future__ import annotations

import psutil
import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = [pytest.mark.integration, pytest.mark.backends]


def test_workers_survive_a_node_agent_restart_and_are_re_adopted(live, deployment):
    # prefill, decode, gateway (the gateway's row reads ready from the next health pass after it answers)
    before = live.wait_for("prefill, decode and the gateway ready", lambda: (
        b := {w["id"]: w["pid"] for w in live.workers(DEPLOYMENT) if w["status"] == "ready"}) and len(b) == 3 and b)
    old_agent = live.stack.pid("agent")

    live.stack.restart("agent")
    assert live.stack.pid("agent") != old_agent and not psutil.pid_exists(old_agent)
    assert all(psutil.pid_exists(pid) for pid in before.values())
    assert completion(deployment).status_code == 200  # served while no agent ran

    log = live.var_dir / "logs" / "agent.log"
    adopted = f"'adopted': {sorted(before)}"
    live.wait_for("the new agent to re-adopt all three", lambda: adopted in log.read_text(errors="replace"))
    # Still the same processes, still ready, and no restart of any of them was recorded.
    wait_steady(live)
    after = {w["id"]: w["pid"] for w in live.workers(DEPLOYMENT) if w["status"] == "ready"}
    assert after == before
    assert not [a for a in live.actions(DEPLOYMENT, kind="restart") if a["params"].get("pid") in before.values()]
    assert completion(deployment).status_code == 200
