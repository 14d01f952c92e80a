"""agent_kill on a real node agent under a real supervisor (the integration stack's, `make run`'s): the agent SIGKILLs
itself once its injected row is written; its worker process, in a session of its own, keeps running; the supervisor
starts the agent again, which adopts the worker (same pid, never restarted) and writes the revert row; the run
passes. Real stack: web, Celery control worker with beat, node agent, a simulated-engine worker process."""
from __future__ import annotations

import pytest
import psutil

from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import free_port

pytestmark = pytest.mark.integration
NAME = "agent-kill"
CHAOS = f"deployments/{NAME}/chaos"


def test_a_killed_agent_is_started_again_and_adopts_its_workers(tmp_path_factory, tiny_model_dir):
    var_dir = tmp_path_factory.mktemp("tandem-agent-kill")
    services = IsolatedServices(var_dir)
    stack = None
    try:
        stack = live_stack_start(var_dir, services)
        created = stack.api("POST", "deployments/", json={
            "name": NAME, "mode": "colocated", "model_path": str(tiny_model_dir),
            "engine_settings": {"simulate": "tiny-cpu"}, "replicas": {"colocated": 1}, "gateway_port": free_port()})
        assert created.status_code == 202, created.text
        worker = stack.wait_for("the colocated worker", lambda: next(
            (w for w in stack.workers(NAME) if w["role"] == "colocated" and w["status"] == "ready"), None),
            timeout=120)
        assert stack.api("PUT", CHAOS, json={"enabled": True}).status_code == 200
        experiment = stack.api("POST", f"{CHAOS}/experiments", json={
            "name": "agent-kill", "target": {"role": "colocated"}, "faults": [{"kind": "agent_kill"}],
            "duration_s": 3, "hypothesis": [{"metric": "ready_workers", "role": "colocated", "min": 1}],
            "recovery_timeout_s": 90})
        assert experiment.status_code == 201, experiment.text
        agent_pid = stack.stack.pid("agent")

        run = stack.api("POST", f"{CHAOS}/experiments/agent-kill/run", json={})
        assert run.status_code == 201, run.text
        run = run.json()
        # wait_for polls the supervisor, which starts the agent again after its backoff.
        stack.wait_for("the agent to be started again", lambda: stack.stack.pid("agent") != agent_pid
                       and stack.stack.is_running("agent"), timeout=60)
        body = stack.wait_for(f"run {run['id']} to finish", lambda: (
            lambda b: b if b["status"] == "finished" else None)(
            stack.api("GET", f"{CHAOS}/runs/{run['id']}").json()), timeout=150, interval=0.5)
        report = stack.api("GET", f"{CHAOS}/runs/{run['id']}/report").json()
        assert body["verdict"] == "passed", report
        fault, = report["faults"]
        assert fault["injected"]["outcome"] == "killed" and fault["reverted"]["outcome"] == "restarted", fault
        reverted = stack.action(fault["reverted"]["action"])["result"]
        assert reverted["by"] == "the agent's restart" and worker["id"] in reverted["adopted"], reverted
        assert stack.action(fault["injected"]["action"])["result"]["agent_pid"] == agent_pid
        # The worker kept its process: adopted, not restarted; and nothing is left stopped.
        after = stack.api("GET", f"workers/{worker['id']}/").json()
        assert after["status"] == "ready" and after["pid"] == worker["pid"], after
        assert psutil.Process(worker["pid"]).status() != psutil.STATUS_STOPPED
    finally:
        if stack is not None:
            live_stack_stop(stack)
        services.close()
