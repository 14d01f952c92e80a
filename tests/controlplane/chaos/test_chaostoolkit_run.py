"""`chaos run` from the real chaostoolkit package drives a Tandem experiment through the REST API: the exported file
as it is, with $TANDEM_URL (pytest-django's live server) and an operator's $TANDEM_TOKEN. Its probes read the
steady state before and after, its action starts the run (the agent pauses a real child process) and waits for the
verdict the driver gives, its rollback finds nothing left to abort."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.controlplane.chaos.conftest import chaos_pass, process_state, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
CHAOS = Path(sys.executable).parent / "chaos"


@pytest.fixture
def beat(gateway):
    """The scrape and the driver's periodic pass, every 0.5 s, over a gateway that serves 10 more requests each
    time."""
    from django.db import connection

    stop = threading.Event()

    def loop():
        ok = 0
        try:
            while not stop.is_set():
                ok += 10
                gateway.serve(ok)
                chaos_pass()
                stop.wait(0.5)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


def test_chaos_run_drives_a_tandem_experiment_to_its_verdict(live_server, experiment, world, agent_inline, beat,
                                                             operator, viewer_api, tmp_path):
    from controlplane.chaos.models import ChaosRun, Verdict
    from controlplane.chaos.selectors import experiment_steady_state
    from controlplane.models import Action
    from controlplane.services.tokens import token_issue

    wait_until("a steady history", lambda: experiment_steady_state(experiment, now=time.time())[
        "holds"], timeout=30)
    exported = viewer_api.get("/api/v1/deployments/demo/chaos/experiments/pause-decode/chaostoolkit.json").json()
    path = tmp_path / "pause-decode.json"
    path.write_text(json.dumps(exported))
    env = {**os.environ, "TANDEM_URL": live_server.url, "TANDEM_TOKEN": token_issue(user=operator, name="ctk"),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(CHAOS), "--no-version-check", "--log-file", str(tmp_path / "chaos.log"), "run",
                           "--journal-path", str(tmp_path / "journal.json"), str(path)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert journal["status"] == "completed" and not journal["deviated"], journal
    assert journal["steady_states"]["before"]["steady_state_met"]
    assert journal["steady_states"]["after"]["steady_state_met"]
    [action] = journal["run"]
    assert action["status"] == "succeeded" and action["output"]["verdict"] == Verdict.PASSED
    assert journal["rollbacks"][0]["output"] == {"aborted": False}

    run = ChaosRun.objects.get()
    assert (run.verdict, run.created_by, run.spec["name"]) == (Verdict.PASSED, operator, "pause-decode")
    events = [a.params.get("event") for a in Action.objects.filter(params__chaos_run=run.pk).order_by("id")]
    assert events[0] == "chaos_started" and events[-1] == "chaos_finished"
    assert {"fault_injected", "fault_reverted"} <= set(events)
    assert process_state(world["handle"].pid) != "stopped"


def test_the_activities_fail_with_tandems_reason(live_server, experiment, world, admin, operator):
    """Called as `chaos` calls them: a probe without data, an experiment edited since the export, a deployment that
    has not opted in, each fail the activity with a reason that says which."""
    from chaoslib.exceptions import ActivityFailed

    from controlplane.chaos.services import chaos_enable, experiment_update
    from controlplane.services.tokens import token_issue
    from tandem_chaostoolkit import actions, probes

    configuration = {"tandem_url": live_server.url, "tandem_deployment": "demo"}
    secrets = {"token": token_issue(user=operator, name="ctk")}
    with pytest.raises(ActivityFailed, match="error_ratio: no data in the window"):
        probes.metric_value("pause-decode", "error_ratio", window_s=5, configuration=configuration, secrets=secrets)
    assert probes.metric_value("pause-decode", "ready_workers", role="decode", configuration=configuration,
                               secrets=secrets) == 1.0
    with pytest.raises(ActivityFailed, match="has no check of metric=requests"):
        probes.metric_value("pause-decode", "requests", configuration=configuration, secrets=secrets)

    experiment_update(experiment=experiment, actor=admin, duration_s=4)
    with pytest.raises(ActivityFailed, match="differs from this file in duration_s: export it again"):
        actions.run_experiment("pause-decode", target={"role": "decode", "count": 1}, faults=[{"kind": "pause"}],
                               duration_s=5, configuration=configuration, secrets=secrets)
    chaos_enable(deployment=world["deployment"], enabled=False, actor=admin)
    with pytest.raises(ActivityFailed, match="HTTP 403 chaos_disabled: deployment 'demo' has not opted in"):
        actions.run_experiment("pause-decode", duration_s=4, configuration=configuration, secrets=secrets)
    with pytest.raises(ActivityFailed, match="the tandem secrets need a token"):
        actions.abort_run("pause-decode", configuration=configuration, secrets={})
    assert actions.abort_run("pause-decode", configuration=configuration, secrets=secrets) == {"aborted": False}
