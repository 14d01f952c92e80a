"""The README's canary, repeated on the demo as `make run` brings it up: does an identical revision promote itself
every time, and is a canary whose workers fail still aborted with no client failure?

`make run` (a process of its own with an isolated var folder: tests/controlplane/integration/make_run.py) with the
demo's defaults (SmolLM2, the demo's own load on). Then, through the REST API only, --repeats times: the README's
canary request with the current revision's own engine settings (an identical revision), waited until it ends. Then
once: the same canary, whose colocated (or prefill) worker a chaos `error` fault makes answer every generation
request with a 500 (docs/chaos.md), waited until it ends. A client of our own sends a request every
--interval s throughout, beside the demo's load, and counts what failed. Prints one JSON document: per canary its
verdict, duration, analysis notes and the client failures during it.

    python bench/fleet/canary_repeat.py                 # long: a whole canary per repeat
    python bench/fleet/canary_repeat.py --repeats 2     # a quick check
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from bench.lib.common import emit, environment  # noqa: E402
from tests.controlplane.integration.make_run import MakeRun  # noqa: E402

DEMO = "demo"
# The README's canary request: 20 s unjudged, then 60 s judged once each side served 5 requests.
STEPS = [{"weight": 50, "duration_s": 20, "analysis": False}, {"weight": 50, "duration_s": 60}]
ANALYSIS = {"min_requests": 5, "max_latency_ratio": 2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between our client's requests")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one canary may take")
    return p.parse_args(argv)


class Clients(threading.Thread):
    """Our client beside the demo's load: a short completion every `interval_s`, each outcome kept with the revision
    that served it (X-Tandem-Revision) and its status, or the exception."""

    def __init__(self, gateway_url: str, interval_s: float):
        super().__init__(daemon=True)
        self.gateway_url, self.interval_s = gateway_url, interval_s
        self.outcomes: list[tuple[float, str, int | str]] = []
        self.stopped = threading.Event()

    def run(self):
        body = {"model": DEMO, "prompt": "Count: one, two,", "max_tokens": 8, "temperature": 0}
        while not self.stopped.is_set():
            try:
                response = requests.post(f"{self.gateway_url}/v1/completions", json=body, timeout=60)
                outcome = response.status_code
                if outcome == 200 and not response.json()["choices"][0]["text"]:
                    outcome = "empty answer"
                self.outcomes.append((time.monotonic(), response.headers.get("X-Tandem-Revision", ""), outcome))
            except (requests.RequestException, ValueError, KeyError) as exc:
                self.outcomes.append((time.monotonic(), "", repr(exc)))
            time.sleep(self.interval_s)

    def stop(self):
        self.stopped.set()
        self.join(90)


class Api:
    def __init__(self, web_url: str, token: str):
        self.base, self.headers = f"{web_url}/api/v1", {"Authorization": f"Token {token}"}

    def __call__(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, f"{self.base}/{path}", headers=self.headers, timeout=30, **kwargs)

    def wait(self, what: str, predicate, timeout: float, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise SystemExit(f"timed out waiting for {what}")


def steady(api: Api) -> int:
    """Wait until no rollout or replacement runs and only the current revision's workers serve; its number."""
    def check():
        deployment = api("GET", f"deployments/{DEMO}/").json()
        workers = api("GET", "workers/", params={"deployment": DEMO}).json()
        workers = workers.get("results", workers) if isinstance(workers, dict) else workers
        serving = [w for w in workers if w["role"] != "gateway" and w["status"] in ("starting", "ready", "draining")]
        current = deployment["current_revision"]
        if serving and all(w["revision"] == current and w["status"] == "ready" for w in serving):
            return current
        return None
    return api.wait("a steady demo", check, timeout=600, interval=2.0)


def canary(api: Api, clients: Clients, args, *, fail: bool) -> dict:
    stable = steady(api)
    revisions = api("GET", f"deployments/{DEMO}/revisions/").json()
    revisions = revisions.get("results", revisions) if isinstance(revisions, dict) else revisions
    settings = next(r["engine_settings"] for r in revisions if r["number"] == stable)
    started, outcomes_before = time.monotonic(), len(clients.outcomes)
    def create():
        answer = api("POST", f"deployments/{DEMO}/rollouts", json={
            "strategy": "canary", "revision": {"engine_settings": settings,
                                               "comment": "failing canary" if fail else "identical canary"},
            "steps": STEPS, "analysis": ANALYSIS})
        return None if answer.status_code == 409 else answer  # the last promote's action still finishing

    created = api.wait("the last change's action to finish", create, timeout=300, interval=2.0)
    if created.status_code != 201:
        raise SystemExit(f"the canary was refused: {created.status_code} {created.text}")
    rollout = created.json()
    chaos_run = failing(api, rollout["revision"]) if fail else None
    done = api.wait("the canary's end", lambda: (r := api("GET", f"deployments/{DEMO}/rollouts/{rollout['id']}")
                                                  .json())["status"] in ("promoted", "aborted", "failed") and r,
                    timeout=args.timeout, interval=2.0)
    if chaos_run is not None:
        api("POST", f"deployments/{DEMO}/chaos/runs/{chaos_run}/abort", json={})
    window = clients.outcomes[outcomes_before:]
    return {"revision": rollout["revision"], "status": done["status"],
            "seconds": round(time.monotonic() - started, 1), "reason": done.get("reason") or done.get("note"),
            "analysis": [{"verdict": run.get("verdict"), "note": run.get("note")}
                         for run in done.get("analysis_runs", [])],
            "client_requests": len(window), "client_failures": [o[2] for o in window if o[2] != 200],
            "served_by_canary": sum(1 for o in window if o[1] == str(rollout["revision"]) and o[2] == 200)}


def failing(api: Api, revision: int) -> int:
    """A chaos `error` fault on the canary's serving worker: every generation request it gets answers 500."""
    api("PUT", f"deployments/{DEMO}/chaos", json={"enabled": True, "reason": "canary_repeat"})
    role = "colocated" if api("GET", f"deployments/{DEMO}/").json()["mode"] == "colocated" else "prefill"
    name = f"fail-canary-{revision}"
    created = api("POST", f"deployments/{DEMO}/chaos/experiments", json={
        "name": name, "target": {"role": role, "revision": revision, "count": 1},
        "faults": [{"kind": "error", "ratio": 1}], "duration_s": 300,
        "hypothesis": [{"metric": "ready_workers", "role": role, "min": 1}], "recovery_timeout_s": 60})
    if created.status_code != 201:
        raise SystemExit(f"the failing canary's experiment was refused: {created.text}")

    def ready():
        workers = api("GET", "workers/", params={"deployment": DEMO, "role": role}).json()
        workers = workers.get("results", workers) if isinstance(workers, dict) else workers
        return any(w["revision"] == revision and w["status"] == "ready" for w in workers)
    api.wait("the canary's worker to be ready", ready, timeout=300)
    started = api("POST", f"deployments/{DEMO}/chaos/experiments/{name}/run", json={})
    if started.status_code != 201:
        raise SystemExit(f"the failing canary's chaos run was refused: {started.text}")
    return started.json()["id"]


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tandem-canary-repeat-"))
    make_run = MakeRun(work, ROOT / "var" / "models" / "tiny", TANDEM_DEMO_MODEL="smollm2", TANDEM_DEMO_LOAD="1")
    make_run.start()
    results = []
    try:
        token = re.search(r"API token\s+([0-9a-f]{40})", make_run.wait_output("Tandem is ready in", timeout=900)
                          ).group(1)
        api = Api(make_run.web_url, token)
        clients = Clients(make_run.gateway_url, interval_s=args.interval)
        clients.start()
        try:
            for _ in range(args.repeats):
                results.append(canary(api, clients, args, fail=False))
            failing_canary = canary(api, clients, args, fail=True)
        finally:
            clients.stop()
    finally:
        make_run.stop()
    promoted = sum(r["status"] == "promoted" for r in results)
    return {"benchmark": "canary_repeat", "demo": "make run (SmolLM2, the demo's load on)", "steps": STEPS,
            "analysis": ANALYSIS, "identical": results, "failing": failing_canary,
            "goals": {f"an identical canary promotes {args.repeats} of {args.repeats}": promoted == args.repeats,
                      "a failing canary is aborted": failing_canary["status"] == "aborted",
                      "no client failure throughout": not any(r["client_failures"]
                                                              for r in [*results, failing_canary])},
            "promoted": promoted, "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
