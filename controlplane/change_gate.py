"""The change gate's seam: before an operator's change is applied, the replay app may predict it and refuse it.

The replay app replays the deployment's recorded traffic as it stands and as changed (controlplane/replay/gate.py)
and provides `check` at ready(), so that the core depends on this seam and never imports a feature app. `check`
raises the core's 409 (errors.conflict) naming the prediction when the deployment's gate is on and the change
would fall short of its objectives; an `acknowledged` change (the caller says it knows) passes. Until a provider is
registered every change passes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

GATE_REFUSED = "prediction_below_objective"  # the 409's code

_check: Callable[[Any, dict, bool], None] = lambda deployment, change, acknowledged: None


def provide(check: Callable[[Any, dict, bool], None]) -> None:
    global _check
    _check = check


def check(deployment, change: dict, *, acknowledged: bool = False) -> None:
    """Refuse `change` (the what-if's shape: {"pools": {role: {"replicas": n}}}, ...) with a 409, or return."""
    _check(deployment, change, acknowledged)
