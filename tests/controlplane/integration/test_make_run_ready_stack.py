"""A `make run` of the demo as a newcomer gets it (SmolLM2, the default settings) that reached "ready": its first
conversion shows one progress bar, it takes at most 2 GiB of RAM and says what it takes, its wait sent no request the gateway counts as an error (it asked /health), the
first real request works, and a restart of one of its own processes is an action on the actions page."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

from tests.controlplane.integration.make_run import PASSWORD, MakeRun
from tests.procs import ROOT

pytestmark = pytest.mark.integration
# Two SmolLM2 workers loading together on a loaded 2-core machine; the wait ends as soon as the banner shows.
DEMO_READY_TIMEOUT_S = 360


@pytest.fixture(scope="module")
def first_conversion(tmp_path_factory) -> str:
    """What a newcomer's first `make run` prints while it converts SmolLM2 (stderr of `inference.models prepare`).
    It converts into the session's models folder when that has none yet (then the stack below reuses it), else
    into a folder of its own, so that it always converts."""
    from tests.conftest import MODELS_DIR
    from inference.hardware import cpu_has_native_bfloat16
    from inference.models.smollm2 import SourceMissing, gguf_path

    try:
        gguf_path()
    except SourceMissing as exc:
        pytest.skip(str(exc))  # the wheel is a `make setup` step
    # The folder and dtype make run picks on this CPU (controlplane/run/demo.py's model_target).
    dtype = "bfloat16" if cpu_has_native_bfloat16() else "float32"
    folder = "smollm2-135m" if dtype == "bfloat16" else "smollm2-135m-float32"
    target = MODELS_DIR / folder
    if (target / "config.json").is_file():
        target = tmp_path_factory.mktemp("first-run") / folder
    result = subprocess.run([sys.executable, "-m", "inference.models", "prepare", "smollm2", "--out", str(target),
                             "--dtype", dtype], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory, first_conversion):
    from tests.conftest import MODELS_DIR

    run = MakeRun(tmp_path_factory.mktemp("make-run"), MODELS_DIR / "tiny", TANDEM_DEMO_MODEL="smollm2")
    try:
        run.start()
        run.token = re.search(r"API token\s+([0-9a-f]{40})",
                              run.wait_output("Tandem is ready in", timeout=DEMO_READY_TIMEOUT_S)).group(1)
        yield run
    finally:
        run.stop()


def test_the_first_conversion_shows_one_progress_bar_and_no_warning(first_conversion):
    lines = [line.strip() for line in first_conversion.replace("\r", "\n").splitlines() if line.strip()]
    assert lines, "no progress shown"
    assert all(line.startswith("smollm2:") for line in lines), "\n".join(lines)


def test_the_demo_takes_at_most_two_gb_and_says_what_it_takes(run, capsys):
    """Measured after the demo has served requests (a worker maps its weights at load, but its pages become resident
    as the forwards touch them). PSS, not the RSS sum: RSS counts each shared page once per process (torch's
    libraries, and the weights, which both workers map from one file), so its sum is more than the demo takes."""
    line = re.search(r"memory\s+(\d+\.\d+) GiB RSS in all \((\d+\.\d+) GiB counting shared pages once\) over "
                     r"(\d+) processes", run.output())
    assert line, run.output()
    for prompt in ("The capital of France is", "Write a haiku about the sea."):
        response = requests.post(f"{run.gateway_url}/v1/completions", timeout=120,
                                 json={"model": "demo", "prompt": prompt, "max_tokens": 16})
        assert response.status_code == 200, response.text
    processes = [psutil.Process(run.proc.pid), *psutil.Process(run.proc.pid).children(recursive=True)]
    memory = [process.memory_full_info() for process in processes]
    rss, pss = sum(m.rss for m in memory) / 2**30, sum(m.pss for m in memory) / 2**30
    with capsys.disabled():
        print(f"\nthe demo (SmolLM2, default settings): at ready {line.group(2)} GiB PSS, {line.group(1)} GiB RSS "
              f"summed; after two requests {pss:.2f} GiB PSS, {rss:.2f} GiB RSS summed; {len(processes)} processes")
    # web, control worker, beat, agent, gateway, prefill and decode at least (Celery forks children of its own).
    assert len(processes) >= 7 and int(line.group(3)) >= 7
    assert float(line.group(2)) <= float(line.group(1)) and pss <= rss
    assert pss * 2**30 <= 2e9  # 2 GB


def _errors(run) -> dict[str, float]:
    """The gateway's error counters, read with the scrape token an operator gets from the API (as Prometheus)."""
    token = requests.get(f"{run.web_url}/api/v1/prometheus/scrape-token", timeout=10,
                         headers={"Authorization": f"Token {run.token}"}).text
    text = requests.get(f"{run.gateway_url}/metrics", timeout=10, headers={"Authorization": f"Bearer {token}"}).text
    assert "tandem_request_success_total" in text, text[:300]
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("tandem_request_errors_total{")}


def test_the_startup_wait_leaves_no_errors_and_the_first_request_works(run):
    assert all(value == 0 for value in _errors(run).values()), _errors(run)
    response = requests.post(f"{run.gateway_url}/v1/completions", timeout=60,
                             json={"model": "demo", "prompt": "The capital of France is", "max_tokens": 4,
                                   "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
    assert all(value == 0 for value in _errors(run).values()), _errors(run)


def test_a_restart_of_its_own_beat_is_an_action_on_the_actions_page(run):
    beat = next(child for child in psutil.Process(run.proc.pid).children()
                if "beat" in child.cmdline() and "worker" not in child.cmdline())
    beat.send_signal(signal.SIGKILL)

    deadline = time.monotonic() + 90
    while True:
        actions = run.api("GET", "actions/", run.token, params={"actor": "tandem_run", "kind": "restart"}).json()
        restarts = [a for a in actions["results"] if a["params"].get("process") == "beat"]
        if restarts:
            break
        assert time.monotonic() < deadline, f"no restart action for beat:\n{run.output()}"
        time.sleep(0.5)
    action = restarts[0]
    assert (action["actor_type"], action["status"], action["deployment"]) == ("system", "succeeded", "")
    assert action["params"]["exit_code"] == -9 and action["params"]["num_restarts"] == 1
    assert "beat process exited (signal 9 (SIGKILL)) and was started again" in action["reason"]

    session = requests.Session()
    login = session.get(f"{run.web_url}/accounts/login/", timeout=15)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
    signed_in = session.post(f"{run.web_url}/accounts/login/", timeout=15, headers={"Referer": login.url},
                             data={"username": "admin", "password": PASSWORD, "csrfmiddlewaretoken": csrf})
    assert signed_in.ok and "/accounts/login/" not in signed_in.url
    page = session.get(f"{run.web_url}/actions/", params={"actor": "tandem_run"}, timeout=15).text
    row = re.search(rf'<tr data-action="{action["id"]}">(.*?)</tr>', page, re.S).group(1)
    assert "restart" in row and "beat" in row and "signal 9 (SIGKILL)" in row
