"""A deployment's latency objectives: P99 TTFT, inter-token latency and end-to-end latency, in seconds.

They are settings, not measurements: the deployment page draws them beside the measured P99s, and the default alert
rules tied to them (alerting.services.defaults.OBJECTIVE_RULES) take them as their thresholds whenever they change,
in the same transaction, so a rule's threshold is a plain number that evaluation, the API and the Prometheus export
read alike.
"""
from __future__ import annotations

import math

from controlplane.errors import invalid
from controlplane.models import Action, ActionKind, ActionStatus, Deployment
from controlplane.models.deployments import DEFAULT_OBJECTIVES
from controlplane.services.actions import action_create, action_once, as_actor

# An objective above an hour is a typo (a value in milliseconds), not a latency goal.
MAX_OBJECTIVE_S = 3600.0


def validate_objectives(value, *, field: str = "objectives") -> dict[str, float]:
    """A partial {name: seconds} → the same as floats; 400 naming `objectives.<name>` for an unknown name or a value
    that is not a number in (0, 3600]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{field} must be an object of objective → seconds, e.g. {{\"ttft_p99_seconds\": 5}}",
                      field=field)
    clean = {}
    for name, seconds in value.items():
        where = f"{field}.{str(name)[:64]}"
        if name not in DEFAULT_OBJECTIVES:
            raise invalid(f"{where} is not an objective; known: {', '.join(DEFAULT_OBJECTIVES)}", field=where)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise invalid(f"{where} must be a number of seconds, not {repr(seconds)[:60]}", field=where)
        if not 0 < seconds <= MAX_OBJECTIVE_S:
            raise invalid(f"{where} must be more than 0 and at most {MAX_OBJECTIVE_S:g} seconds, not {seconds:g}",
                          field=where)
        clean[name] = float(seconds)
    return clean


def objectives_merge(current: dict | None, changes: dict[str, float]) -> dict[str, float]:
    """Every objective present: the defaults, then what is stored, then the changes."""
    return {**DEFAULT_OBJECTIVES, **{k: v for k, v in (current or {}).items() if k in DEFAULT_OBJECTIVES},
            **changes}


def deployment_objectives_set(*, deployment: Deployment, objectives, actor, reason: str = "",
                              idempotency_key: str | None = None) -> Action:
    """Change some objectives of a deployment (operator). 1. Validate (nothing is written on a 400). 2. Save the
    merged objectives; the post_save of alerting moves the thresholds of the rules that follow them. 3. One
    `objectives` action with the old and new values."""
    actor = as_actor(actor)
    changes = validate_objectives(objectives)
    if not changes:
        raise invalid("objectives must name at least one objective to change", field="objectives")

    def write() -> Action:  # inside action_once's transaction
        row = Deployment.objects.select_for_update().get(pk=deployment.pk)
        before = objectives_merge(row.objectives, {})
        row.objectives = objectives_merge(row.objectives, changes)
        row.save(update_fields=["objectives"])
        deployment.objectives = row.objectives
        return action_create(kind=ActionKind.OBJECTIVES, actor=actor, deployment=row, reason=reason,
                             status=ActionStatus.SUCCEEDED, params={"from": before, "to": row.objectives},
                             idempotency_key=idempotency_key)

    return action_once(kind=ActionKind.OBJECTIVES, idempotency_key=idempotency_key, write=write,
                       request={"deployment": deployment.pk, "objectives": changes})
