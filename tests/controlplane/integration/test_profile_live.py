"""Profiling against the live stack: the API queues a quick profile run that the real Celery worker carries out
on separate tiny-model workers while the deployment keeps serving; `tandem_profile --quick` does the same from the
terminal with a progress bar; the planner then answers from the stored profiles."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady
from tests.controlplane.integration.live import manage
from tests.procs import ROOT

pytestmark = pytest.mark.integration


def test_a_profile_job_runs_on_the_celery_worker_without_touching_the_serving_workers(live, deployment):
    serving = {w["id"] for w in wait_steady(live)}
    refused = live.api("POST", f"deployments/{DEPLOYMENT}/profiles", json={"quick": True})
    assert refused.status_code == 409 and "disturb production traffic" in refused.json()["error"]["message"]

    response = live.api("POST", f"deployments/{DEPLOYMENT}/profiles",
                        json={"quick": True, "allow_shared_host": True})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    seen = []  # (status, progress) of each poll, as the page's bar reads them

    def finished():
        job = live.api("GET", f"profile-jobs/{job_id}").json()
        seen.append((job["status"], job["progress"]))
        return job if job["status"] in ("succeeded", "failed") else None

    job = live.wait_for("the profile job to finish", finished, timeout=300, interval=0.2)
    assert job["status"] == "succeeded", job["error"]
    # The page sees the job before it ends, then at 100 %. (How many steps in between it sees depends on the
    # host's speed: progress is written at most every 0.5 s; test_profile_run.py checks every step reported.)
    assert any(status in ("pending", "running") and progress < 1.0 for status, progress in seen), seen
    assert seen[-1][1] == 1.0 and job["progress"] == 1.0
    profiles = live.api("GET", f"deployments/{DEPLOYMENT}/profiles").json()["profiles"]
    assert {p["role"] for p in profiles} == {"prefill", "decode"}
    assert all(p["kv_bytes_per_token"] > 0 for p in profiles)
    # The serving workers are the same ones, still ready, and the deployment still answers.
    assert {w["id"] for w in wait_steady(live)} == serving
    assert completion(deployment).status_code == 200

    plan = live.api("POST", "capacity/plan", json={
        "deployment": DEPLOYMENT, "traffic": {"requests_per_s": 0.5, "prompt_tokens_mean": 64,
                                              "output_tokens_mean": 16},
        "objectives": {"ttft_p99_s": 5.0, "itl_p99_s": 1.0}})
    assert plan.status_code == 200, plan.text
    assert plan.json()["layouts"]["disaggregated"]["feasible"]


def test_tandem_profile_quick_prints_progress_and_exports_the_simulated_worker_format(live, deployment, tmp_path):
    serving = {w["id"] for w in wait_steady(live)}
    with pytest.raises(RuntimeError, match="disturb production traffic"):
        manage(live.env, "tandem_profile", DEPLOYMENT, "--quick", timeout=60)
    export = tmp_path / "profile.json"
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "tandem_profile", DEPLOYMENT, "--quick",
                             "--allow-shared-host", "--export", str(export)], env=live.env, cwd=ROOT, timeout=300,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "prefill profile #" in result.stdout and "decode profile #" in result.stdout
    assert "100%" in result.stderr and "decode: 4 sequences" in result.stderr  # the progress bar and its steps
    data = json.loads(export.read_text())
    assert data["format"] == 1 and set(data["roles"]) == {"prefill", "decode"}
    # The fitted step of one sequence with a 64-token context takes time. Which term carries it is the noisy fit's
    # choice (coefficients are kept >= 0, and on a loaded machine the intercept came out 0 once).
    step = data["roles"]["decode"]["decode"]  # the stage-cost format (inference/stage_costs.py): a + b·B + c·B·L
    assert step["a"] + step["b"] + 64 * step["c"] > 0, step
    assert {w["id"] for w in wait_steady(live)} == serving
