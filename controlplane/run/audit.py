"""The audit-log rows of what `make run`'s supervisor does to the control plane's own processes."""
from __future__ import annotations

import signal

from controlplane.models import Action, ActionKind, ActionStatus
from controlplane.services.actions import Actor, action_create

ACTOR = Actor.system("tandem_run")


def exit_description(code: int | None) -> str:
    """'exit code 1', 'signal 9 (SIGKILL)', or 'exit status unknown' (None: none recorded). make run is its
    children's parent, and processes.is_alive calls a child gone only once it has reaped it, so it knows."""
    if code is None:
        return "exit status unknown"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"


def stack_restart_record(*, process: str, exit_code: int | None, num_restarts: int, log_path: str) -> Action:
    """One `restart` action (actor system "tandem_run", no deployment) for a child of make run (web, the Celery
    control worker, beat, the node agent) that exited on its own and was started again."""
    how = exit_description(exit_code)
    return action_create(
        kind=ActionKind.RESTART, actor=ACTOR, status=ActionStatus.SUCCEEDED,
        reason=f"make run's {process} process exited ({how}) and was started again (restart {num_restarts}; "
               f"log: {log_path})",
        params={"process": process, "exit_code": exit_code, "exit": how, "num_restarts": num_restarts,
                "log": log_path})
