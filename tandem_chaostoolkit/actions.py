"""Actions of a Chaos Toolkit experiment on a Tandem fleet: run a Tandem experiment (its faults injected and
reverted by Tandem's node agents, under its abort conditions) and wait for its verdict, or abort the run.

A fault is always injected by a Tandem run, never on its own: the run is what guarantees its revert (at the end,
on an abort, and by the node agent's own deadline when the control plane is gone)."""
from __future__ import annotations

import logging
import time

from chaoslib.exceptions import ActivityFailed

from tandem_chaostoolkit.client import call

__all__ = ["run_experiment", "abort_run"]
log = logging.getLogger("chaostoolkit")
POLL_S = 1.0
WAIT_MARGIN_S = 120.0  # beyond the run's own duration and recovery timeout: the driver's passes, the agent's word
_SPEC = ("target", "faults", "duration_s", "abort_conditions", "recovery_timeout_s")


def run_experiment(experiment: str, target: dict | None = None, faults: list | None = None,
                   duration_s: float | None = None, abort_conditions: list | None = None,
                   recovery_timeout_s: float | None = None, wait: bool = True, configuration: dict | None = None,
                   secrets: dict | None = None) -> dict:
    """Run the Tandem experiment `experiment` and return its report (`wait`) or the run as started.

    1. The fields this file gives (an export gives them all) must be the Tandem experiment's: one edited since
       the export fails here, naming the fields, rather than running something else than the file says.
    2. Start a run: Tandem checks its hypothesis first; a refusal (not in steady state, another run active, the
       deployment not opted in) fails the action with Tandem's reason.
    3. With `wait`, poll the run until it is finished and return its report; a verdict other than `passed` fails
       the action with the report's reasons."""
    given = {key: value for key, value in zip(_SPEC, (target, faults, duration_s, abort_conditions,
                                                       recovery_timeout_s)) if value is not None}
    stored = call("GET", f"experiments/{experiment}", configuration=configuration, secrets=secrets)
    differ = [key for key, value in given.items() if stored.get(key) != value]
    if differ:
        raise ActivityFailed(f"the Tandem experiment {experiment!r} differs from this file in {', '.join(differ)}: "
                             "export it again, or import this file")
    run = call("POST", f"experiments/{experiment}/run", configuration=configuration, secrets=secrets,
               body={"reason": "chaos toolkit: chaos run"})
    log.info("Tandem run %s of %s started on %s", run["id"], experiment, [t["worker"] for t in run["targets"]])
    if not wait:
        return run
    deadline = time.monotonic() + stored["duration_s"] + stored["recovery_timeout_s"] + WAIT_MARGIN_S
    while run["status"] != "finished":
        if time.monotonic() > deadline:
            raise ActivityFailed(f"Tandem run {run['id']} has not finished; it is {run['status']}")
        time.sleep(POLL_S)
        run = call("GET", f"runs/{run['id']}", configuration=configuration, secrets=secrets)
    report = call("GET", f"runs/{run['id']}/report", configuration=configuration, secrets=secrets)
    if report["verdict"] != "passed":
        raise ActivityFailed(f"Tandem run {run['id']}: {report['verdict']}: {'; '.join(report['reasons'])}")
    return report


def abort_run(experiment: str, reason: str = "aborted by a Chaos Toolkit rollback", configuration: dict | None = None,
              secrets: dict | None = None) -> dict:
    """Abort the deployment's active run when it is one of `experiment` (every fault reverted at once); a run
    already finished, or none, is left alone: {"aborted": false}."""
    active = call("GET", "", configuration=configuration, secrets=secrets).get("active_run")
    if active is None:
        return {"aborted": False}
    run = call("GET", f"runs/{active}", configuration=configuration, secrets=secrets)
    if run["experiment"] != experiment:
        return {"aborted": False, "active_run": active}
    run = call("POST", f"runs/{active}/abort", configuration=configuration, secrets=secrets, body={"reason": reason})
    return {"aborted": True, "run": run}
