"""Each kind of alert action, declared once: its name, label, the parameters it takes and how each is checked, what it
acts on, the Alertmanager `tandem_action` values that ask for it, and the function that runs it.

Rule validation (services.rules), the evaluator's dispatch (services.rule_actions, services.carry_out), the
Alertmanager receiver (services.alertmanager), the API's and the rule form's help all read ALERT_ACTIONS. What an
action acts on (ACTS_ON) decides the rest: its cooldown target, the scope a rule needs for it, what an alert must
carry for it to run, and which label of an Alertmanager alert names its target.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from controlplane.alerting.models import Alert, AlertRule, Channel
from controlplane.alerting.models.rules import ScopeRole
from controlplane.alerting.services.notifications import delivery_enqueue, notify
from controlplane.alerting.webhooks.inbound import positive_int
from controlplane.errors import invalid
from controlplane.models import Action, Deployment, Worker
from controlplane.services import Actor, deployment_rollback, pool_scale_by, worker_restart

DONE, SKIPPED, REFUSED = "done", "skipped", "refused"
# What an action acts on: the alert's pool, its worker, its deployment, or the alert itself (to tell people).
POOL, WORKER, DEPLOYMENT, ALERT = "pool", "worker", "deployment", "alert"
ACTS_ON = (POOL, WORKER, DEPLOYMENT, ALERT)
MAX_STEP = 64


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # DONE (action carries the row), SKIPPED (nothing to do) or REFUSED (the service said no)
    action: Action | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    check: Callable[[Any, str], Any]  # (value, its field) → the clean value; raises invalid naming the field
    default: Any = None  # taken when the key is absent; None: the action goes without it
    help: str = ""
    # (text, its annotation) → the value, for an Alertmanager annotation `tandem_<kind>_<name>`; None: not settable
    # from Alertmanager.
    from_text: Callable[[str, str], Any] | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One action to carry out: on what, as whom, why, under which idempotency key."""
    deployment: Deployment | None
    actor: Actor
    reason: str
    idempotency_key: str
    params: dict  # every parameter of the kind, defaults filled in
    role: str = ""
    worker: Worker | None = None
    alert: Alert | None = None  # the rule's alert (None: an Alertmanager alert)
    rule: AlertRule | None = None
    event: str = "firing"
    now: datetime | None = None
    deliver: Callable[[int], None] | None = None  # how a notification's deliveries are sent (default: Celery)


@dataclass(frozen=True, slots=True)
class AlertActionKind:
    name: str
    label: str
    acts_on: str  # one of ACTS_ON
    run: Callable[[Call], Action]  # through the core service; raises its ControlPlaneError to refuse
    params: tuple[Param, ...] = ()
    inbound: dict[str, dict] = field(default_factory=dict)  # Alertmanager's tandem_action values → fixed params
    on_resolved: bool = False  # also run (event "resolved") when the alert resolves, if it ran for the firing

    def describe(self) -> str:
        names = ", ".join(param.name for param in self.params)
        return f"{self.name}{f' ({names})' if names else ''}: {self.label}"


def _channels(names, where: str) -> list[str]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid(f"{where} must be a list of channel names", field=where)
    known = set(Channel.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [n for n in names if n not in known]
    if missing:
        raise invalid(f"{where}: unknown channel(s) {', '.join(missing)}", field=where)
    return names


def _direction(direction, where: str) -> str:
    if direction not in ("up", "down"):
        raise invalid(f"{where} must be 'up' or 'down'", field=where)
    return direction


def _step(step, where: str) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_STEP:
        raise invalid(f"{where} must be an integer from 1 to {MAX_STEP}", field=where)
    return step


def _step_text(text: str, annotation: str) -> int:
    step = positive_int(text, most=MAX_STEP)
    if step is None:
        raise invalid(f"{annotation} must be an integer 1..{MAX_STEP}", field=annotation)
    return step


def _notify(call: Call) -> Action:
    return notify(alert=call.alert, rule=call.rule, channels=call.params["channels"], event=call.event,
                  reason=call.reason, idempotency_key=call.idempotency_key, now=call.now,
                  deliver=call.deliver or delivery_enqueue)


def _scale(call: Call) -> Action:
    step = int(call.params["step"]) * (1 if call.params["direction"] == "up" else -1)
    return pool_scale_by(deployment=call.deployment, role=call.role, step=step, actor=call.actor, reason=call.reason,
                         idempotency_key=call.idempotency_key)


def _restart(call: Call) -> Action:
    return worker_restart(worker=call.worker, actor=call.actor, reason=call.reason,
                          idempotency_key=call.idempotency_key)


def _rollback(call: Call) -> Action:
    return deployment_rollback(deployment=call.deployment, actor=call.actor, reason=call.reason,
                               idempotency_key=call.idempotency_key)


NOTIFY = AlertActionKind(
    "notify", "tell the channels named (no channels: every enabled channel); also sends resolved", ALERT, _notify,
    params=(Param("channels", _channels, help="channel names"),), inbound={"notify": {}}, on_resolved=True)
ALERT_ACTIONS: dict[str, AlertActionKind] = {kind.name: kind for kind in (
    NOTIFY,
    AlertActionKind("scale", "scale the alert's pool by step replicas, within its min..max", POOL, _scale,
                    params=(Param("direction", _direction, default="up", help="up or down"),
                            Param("step", _step, default=1, help=f"1..{MAX_STEP} replicas", from_text=_step_text)),
                    inbound={"scale_up": {"direction": "up"}, "scale_down": {"direction": "down"}}),
    AlertActionKind("restart", "restart the alert's worker (per-worker rules only)", WORKER, _restart,
                    inbound={"restart": {}}),
    AlertActionKind("rollback", "roll the deployment back to its previous revision", DEPLOYMENT, _rollback,
                    inbound={"rollback": {}}),
)}
# Alertmanager's tandem_action values → (kind, the params it fixes).
INBOUND: dict[str, tuple[AlertActionKind, dict]] = {
    name: (kind, params) for kind in ALERT_ACTIONS.values() for name, params in kind.inbound.items()}


def action_params(kind: AlertActionKind, spec: dict) -> dict:
    """Every parameter of the kind from an action entry, defaults filled in."""
    return {param.name: spec.get(param.name, param.default) for param in kind.params}


def action_validate(spec: dict, *, where: str, role: str, per_worker: bool) -> dict:
    """One entry of a rule's actions → the same, normalised; 400 naming the entry or its key for anything else."""
    name = spec.get("type")
    kind = ALERT_ACTIONS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise invalid(f"{where}.type must be one of {', '.join(ALERT_ACTIONS)}, not {name!r}", field=f"{where}.type")
    unknown = set(spec) - {"type"} - {param.name for param in kind.params}
    if unknown:
        raise invalid(f"{where} ({kind.name}) has unknown keys {sorted(unknown)}", field=where)
    entry = {"type": kind.name}
    for param in kind.params:
        value = spec.get(param.name, param.default)
        if value is None and param.default is None:
            continue
        entry[param.name] = param.check(value, f"{where}.{param.name}")
    if kind.acts_on == POOL and role == ScopeRole.GATEWAY:
        raise invalid(f"{where}: a gateway has no pool to {kind.name}; scope the rule to a pool role",
                      field=f"{where}.type")
    if kind.acts_on == WORKER and not per_worker:
        raise invalid(f"{where}: {kind.name} needs a per-worker rule (per_worker: true) to know which worker",
                      field=f"{where}.type")
    return entry


def action_acts_on(spec: dict) -> str:
    """What an action entry acts on (ALERT for a kind not declared here: the dispatcher refuses it)."""
    kind = ALERT_ACTIONS.get(spec.get("type"))
    return kind.acts_on if kind is not None else ALERT


def action_key(alert: Alert, index: int, event: str = "firing") -> str:
    """The idempotency key of a rule's action for one firing (or its resolve): one run, one Action."""
    start = int(alert.fired_at.timestamp() * 1000)
    key = f"rule:{alert.rule_id}:{alert.fingerprint}:{start}:{index}"
    return key if event == "firing" else f"{key}:{event}"


def action_target(spec: dict, alert: Alert) -> str:
    """What the action acts on for this alert: its cooldown is per rule, action and target."""
    acts_on = action_acts_on(spec)
    if acts_on == POOL:
        return f"pool:{alert.deployment_id}:{alert.role}"
    if acts_on == WORKER:
        return f"worker:{alert.worker_id}"
    if acts_on == DEPLOYMENT:
        return f"deployment:{alert.deployment_id}"
    return f"alert:{alert.fingerprint}"


def actions_help() -> str:
    """The kinds and their parameters, for the API's and the rule form's help."""
    return "; ".join(kind.describe() for kind in ALERT_ACTIONS.values())
