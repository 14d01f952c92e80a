"""A worker killed with SIGKILL is noticed by its node agent and restarted in place, with an action row."""
from __future__ import annotations

import os
import signal

import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = [pytest.mark.integration, pytest.mark.backends]


def test_a_killed_decode_worker_is_restarted_with_a_new_pid_and_an_action_row(live, deployment):
    victim, = [w for w in wait_steady(live) if w["role"] == "decode"]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted():
        worker = live.api("GET", f"workers/{victim['id']}/").json()
        return worker if worker["status"] == "ready" and worker["pid"] != victim["pid"] else None

    worker = live.wait_for("the decode worker to be restarted", restarted, timeout=90)
    assert worker["restart_count"] == victim["restart_count"] + 1
    restart, = [a for a in live.actions(DEPLOYMENT, kind="restart") if a["worker"] == victim["id"]]
    # The signal when the agent started it; after an agent restart (the session's stack is shared with
    # test_agent_restart) it is an adopted orphan, whose exit status no agent learns. Never its INFO "ready" line.
    assert restart["actor_type"] == "system" and restart["reason"].startswith(
        ("process killed by signal 9 (SIGKILL)", "process ended; exit status unknown (started by an earlier agent)"))
    assert " INFO " not in restart["reason"] and "not our child" not in restart["reason"]
    assert restart["params"]["pid"] == victim["pid"] and restart["params"]["backoff_s"] == 1
    live.wait_for("the restart action to succeed", lambda: live.action(restart["id"])["status"] == "succeeded")
    wait_steady(live)
    live.wait_for("the gateway to answer again", lambda: completion(deployment).status_code == 200, timeout=30)
