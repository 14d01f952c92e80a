"""Write services of chaos experiments: the opt-in, experiments, and a run's moves (start, abort, revert, recover,
finish); which workers a run breaks, and the agent's messages that break them, are targets.py's. Each run move is a
conditional UPDATE on the status it read plus one Action row, and the agent's messages are sent after commit
(robust: a broker that is down costs a late fault or revert, never a 500; a pause is released by the agent's own
deadline in any case).

Audit rows: a run's start is `start`, its end `stop`, an abort `abort`, each with params {"chaos_run", "event"}; the
agent writes one `fault` row per injected fault and one per revert (controlplane.agent.faults), told apart by
params.event."""
from __future__ import annotations

import time
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.agent.faults import AGENT_FAULT_INJECT, AGENT_FAULT_REVERT
from controlplane.celery import task_send
from controlplane.chaos import chaostoolkit, fault_checks, library, validation
from controlplane.chaos.hypothesis import judge_hypothesis
from controlplane.chaos.models import ACTIVE_STATUSES, ChaosRun, ChaosSettings, Experiment, RunStatus, Verdict
from controlplane.chaos.notify import run_end_notify
from controlplane.chaos.readings import check_values
from controlplane.chaos.report import run_report
from controlplane.chaos.targets import check_survivors, fault_messages, run_targets
from controlplane.errors import ControlPlaneError, conflict
from controlplane.models import ActionKind, ActionStatus, Deployment, Node, WorkerRole
from controlplane.services.actions import Actor, action_create, action_once, as_actor, shown_idempotency_key

STARTED_KIND, FINISHED_KIND, ABORTED_KIND = ActionKind.START, ActionKind.STOP, ActionKind.ABORT
ENABLED_KIND, DISABLED_KIND = ActionKind.START, ActionKind.STOP
SYSTEM = Actor.system("chaos")


def deployment_roles(deployment: Deployment) -> set[str]:
    return set(deployment.pools.values_list("role", flat=True)) | {WorkerRole.GATEWAY}


# --- opt-in -------------------------------------------------------------------------------------------------------

def chaos_enabled(deployment: Deployment) -> bool:
    return ChaosSettings.objects.filter(deployment=deployment, enabled=True).exists()


def chaos_enable(*, deployment: Deployment, enabled: bool, actor, reason: str = "",
                 idempotency_key: str | None = None):
    """Opt a deployment in to chaos experiments, or out. Opting out while a run is active is a 409: abort it
    first. Returns the Action."""
    actor = as_actor(actor)
    if not isinstance(enabled, bool):
        raise ControlPlaneError("enabled must be true or false", extra={"field": "enabled"})

    def write():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if not enabled and ChaosRun.objects.filter(deployment=locked, status__in=ACTIVE_STATUSES).exists():
            raise conflict(f"a chaos run of {locked.name!r} is active: abort it before opting out")
        ChaosSettings.objects.update_or_create(deployment=locked, defaults={
            "enabled": enabled, "updated_at": timezone.now(), "updated_by": actor.user})
        return action_create(kind=ENABLED_KIND if enabled else DISABLED_KIND, actor=actor, deployment=locked,
                             reason=reason, status=ActionStatus.SUCCEEDED, idempotency_key=idempotency_key,
                             params={"event": "chaos_enabled" if enabled else "chaos_disabled"})

    return action_once(kind=ENABLED_KIND if enabled else DISABLED_KIND, idempotency_key=idempotency_key,
                       write=write, request={"deployment": deployment.pk, "chaos_enabled": enabled})


# --- experiments --------------------------------------------------------------------------------------------------

def _cleaned(deployment: Deployment, fields: dict, *, new_target: bool = True) -> dict:
    """The validated fields; a node target's node is checked against the fleet only when the target is `new_target`
    (created or changed): an edit of anything else keeps an experiment whose node has no worker just now."""
    roles = deployment_roles(deployment)
    cleaned = {}
    if "name" in fields:
        cleaned["name"] = validation.validate_experiment_name(fields["name"])
    if "description" in fields:
        if not isinstance(fields["description"], str):
            raise ControlPlaneError("description must be a string", extra={"field": "description"})
        cleaned["description"] = fields["description"]
    duration_s = validation.validate_duration(fields["duration_s"])
    cleaned["duration_s"] = duration_s
    cleaned["target"] = validation.validate_target(fields["target"], roles)
    cleaned["faults"] = fault_checks.validate_faults(fields["faults"], duration_s, cleaned["target"].get("role"))
    cleaned["hypothesis"] = validation.validate_hypothesis(fields["hypothesis"], roles)
    cleaned["abort_conditions"] = validation.validate_abort_conditions(fields.get("abort_conditions"), roles)
    cleaned["recovery_timeout_s"] = validation.validate_recovery_timeout(fields.get("recovery_timeout_s", 120))
    if new_target:
        validation.validate_target_node(cleaned["target"], deployment)
    return cleaned


def experiment_create(*, deployment: Deployment, actor, name, target, faults, duration_s, hypothesis,
                      abort_conditions=None, recovery_timeout_s=120, description: str = "") -> Experiment:
    """A new experiment of `deployment` (400 naming the bad field; 409 when the name is taken)."""
    actor = as_actor(actor)
    fields = _cleaned(deployment, dict(name=name, target=target, faults=faults, duration_s=duration_s,
                                       hypothesis=hypothesis, abort_conditions=abort_conditions,
                                       recovery_timeout_s=recovery_timeout_s, description=description))
    try:
        with transaction.atomic():
            return Experiment.objects.create(deployment=deployment, created_by=actor.user, **fields)
    except IntegrityError:
        raise conflict(f"deployment {deployment.name!r} already has an experiment named {name!r}") from None


def experiment_update(*, experiment: Experiment, actor, **changes) -> Experiment:
    """Change some fields; the whole experiment is checked again. A run in progress keeps its own copy."""
    as_actor(actor)
    unknown = sorted(set(changes) - {"target", "faults", "duration_s", "hypothesis", "abort_conditions",
                                     "recovery_timeout_s", "description"})
    if unknown:
        raise ControlPlaneError(f"{unknown[0]} cannot be changed (an experiment is renamed by creating another)",
                                extra={"field": unknown[0]})
    merged = {"description": experiment.description, **experiment.spec(), **changes}
    merged.pop("name")
    fields = _cleaned(experiment.deployment, merged, new_target="target" in changes)
    Experiment.objects.filter(pk=experiment.pk).update(updated_at=timezone.now(), **fields)
    experiment.refresh_from_db()
    return experiment


def experiment_delete(*, experiment: Experiment, actor) -> None:
    """Delete an experiment; its finished runs keep their reports. 409 while one of its runs is active."""
    as_actor(actor)
    with transaction.atomic():
        if ChaosRun.objects.filter(experiment=experiment, status__in=ACTIVE_STATUSES).exists():
            raise conflict(f"experiment {experiment.name!r} has an active run: abort it first")
        Experiment.objects.filter(pk=experiment.pk).delete()


def experiment_from_template(*, deployment: Deployment, actor, template, name=None, role=None, count=1,
                             duration_s=None, node=None) -> Experiment:
    """A new experiment from a built-in template (library.TEMPLATES): its faults, hypothesis and abort conditions,
    with the target role (default: the template's), count, duration (default: the template's) and node (default:
    any) given here. The name defaults to the template's key. 400 naming the bad field; 409 when the name is
    taken."""
    found = library.template_get(template)
    fields = library.template_fields(found, role=found.role if role in (None, "") else role, count=count,
                                     duration_s=found.duration_s if duration_s in (None, "") else duration_s,
                                     node=None if node in (None, "") else node)
    return experiment_create(deployment=deployment, actor=actor, name=name or found.key, **fields)


def experiment_import(*, deployment: Deployment, actor, document) -> Experiment:
    """A new experiment from a Chaos Toolkit experiment (chaostoolkit.from_chaostoolkit). A 400 names the place in
    the document: what cannot be mapped, or the mapped field that experiment_create refuses."""
    fields = chaostoolkit.from_chaostoolkit(document, deployment=deployment.name)
    try:
        return experiment_create(deployment=deployment, actor=actor, **fields)
    except ControlPlaneError as error:
        if error.status == 400 and "field" in error.extra:
            error.extra["field"] = chaostoolkit.ctk_field(error.extra["field"], document)
            error.message = f"{error.extra['field']}: {error.message}"
            error.args = (error.message,)
        raise


# --- runs ---------------------------------------------------------------------------------------------------------

def run_start(*, experiment: Experiment, actor, reason: str = "", idempotency_key: str | None = None) -> ChaosRun:
    """Check the hypothesis, then inject the experiment's faults.

    1. 403 unless the deployment opted in; 409 while another run of it is active.
    2. The hypothesis before: each check over its window ending now. 409 naming each failing check when it does
       not hold (the system is not in steady state, or the gateway's scrapes do not cover the window yet). Its
       values are the baselines of `max_baseline_ratio` checks.
    3. The targets (targets.py: ready workers of the role, of the node; 409 when too few); 400 for a fault their
       nodes cannot take (a resource fault on a simulated node, more memory than a node has), or a broker_freeze or
       db_slow that no agent on the broker's or the database's host can carry out.
    4. The run row (one active per deployment: a partial unique constraint), its `start` Action; after commit, one
       agent message per (fault, target) on the target's node queue.
    """
    actor = as_actor(actor)
    deployment = experiment.deployment
    if not chaos_enabled(deployment):
        raise ControlPlaneError(f"deployment {deployment.name!r} has not opted in to chaos experiments (an admin "
                                f"enables it: PUT /api/v1/deployments/{deployment.name}/chaos)", status=403,
                                code="chaos_disabled")
    if ChaosRun.objects.filter(deployment=deployment, status__in=ACTIVE_STATUSES).exists():
        raise conflict(f"a chaos run of {deployment.name!r} is active: one at a time")
    spec = experiment.spec()
    now = time.time()
    values = check_values(deployment.pk, spec["hypothesis"], now=now)
    before = judge_hypothesis(spec["hypothesis"], values, values)
    if not before["holds"]:
        raise ControlPlaneError("the system is not in steady state: " + "; ".join(before["failing"]), status=409,
                                code="not_steady", extra={"failing": before["failing"], "checks": before["checks"]})
    targets = run_targets(deployment, spec["target"])
    check_survivors(deployment, spec, targets)
    nodes = list(Node.objects.filter(name__in={t["node"] for t in targets}))
    fault_checks.validate_real_hosts(spec["faults"], nodes)
    fault_checks.validate_gpu_memory(spec["faults"], targets, nodes)
    fault_checks.validate_memory_pressure(spec["faults"], nodes)
    carriers = {"broker_freeze": fault_checks.broker_freeze_carrier(spec["faults"], nodes),
                "db_slow": fault_checks.db_slow_carrier(spec["faults"], nodes)}

    def write():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        started = timezone.now()
        faults = fault_messages(spec, targets, carriers)
        try:
            with transaction.atomic():
                run = ChaosRun.objects.create(
                    experiment=experiment, deployment=locked, spec=spec, targets=targets,
                    baseline={"at": now, "values": values, "checks": before["checks"]}, started_at=started,
                    fault_ends_at=started + timedelta(seconds=spec["duration_s"]), created_by=actor.user)
        except IntegrityError:
            raise conflict(f"a chaos run of {locked.name!r} is active: one at a time") from None
        for index, fault in enumerate(faults):
            fault["key"] = f"chaos-{run.pk}-{index}-w{fault['worker']}"
        ChaosRun.objects.filter(pk=run.pk).update(faults=faults)
        action = action_create(
            kind=STARTED_KIND, actor=actor, deployment=locked, reason=reason, status=ActionStatus.SUCCEEDED,
            idempotency_key=idempotency_key,
            params={"chaos_run": run.pk, "event": "chaos_started", "experiment": spec["name"], "targets": targets,
                    "faults": spec["faults"], "duration_s": spec["duration_s"], "hypothesis_before": values})
        audit = {"chaos_run": run.pk, "experiment": spec["name"]}
        for fault in faults:
            until = started.timestamp() + (fault["duration_s"] or spec["duration_s"])
            args = (fault["key"], fault["kind"], fault["worker"], until, audit, fault["params"])
            transaction.on_commit(lambda a=args, q=fault["queue"]: task_send(AGENT_FAULT_INJECT, args=a, queue=q),
                                  robust=True)
        return action

    action = action_once(kind=STARTED_KIND, idempotency_key=idempotency_key, write=write,
                         request={"experiment": experiment.pk, "op": "chaos_run"})
    run_id = (action.params or {}).get("chaos_run")
    if action.params.get("event") != "chaos_started" or run_id is None:
        raise conflict(f"idempotency key {shown_idempotency_key(idempotency_key)!r} was used for another request "
                       f"(action {action.pk})", action_id=action.pk)
    return ChaosRun.objects.get(pk=run_id)


def _send_reverts(run: ChaosRun) -> None:
    audit = {"chaos_run": run.pk, "experiment": run.spec.get("name")}
    for fault in run.faults:
        args = (fault["key"], fault["kind"], fault["worker"], audit)
        transaction.on_commit(lambda a=args, q=fault["queue"]: task_send(AGENT_FAULT_REVERT, args=a, queue=q),
                              robust=True)


def run_revert(*, run: ChaosRun, actor, reason: str, abort: bool = False, at=None) -> bool:
    """running → recovering: revert every fault now (the agent's messages after commit). With `abort`, the run is
    aborted (its verdict will say so) and the `abort` Action names why. False when the run was not running (another
    driver or an operator got there first)."""
    actor = as_actor(actor)
    with transaction.atomic():
        fields = {"status": RunStatus.RECOVERING, "reverted_at": at or timezone.now()}
        if abort:
            fields["abort_reason"] = reason
        if ChaosRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(**fields) != 1:
            return False
        if abort:
            action_create(kind=ABORTED_KIND, actor=actor, deployment=run.deployment, reason=reason,
                          status=ActionStatus.SUCCEEDED, idempotency_key=f"chaos-{run.pk}-aborted",
                          params={"chaos_run": run.pk, "event": "chaos_aborted", "experiment": run.spec.get("name")})
        _send_reverts(run)
    return True


def run_abort(*, run: ChaosRun, actor, reason: str = "") -> ChaosRun:
    """An operator's abort: a running run reverts its faults at once (and its recovery is still measured); a
    recovering one stops waiting and finishes now. 409 once finished."""
    actor = as_actor(actor)
    why = reason or f"aborted by {actor.name}"
    run.refresh_from_db()
    if run.status == RunStatus.RUNNING and run_revert(run=run, actor=actor, reason=why, abort=True):
        return ChaosRun.objects.get(pk=run.pk)
    run.refresh_from_db()
    if run.status == RunStatus.RECOVERING:
        with transaction.atomic():
            # A run aborted already keeps its first reason (and its one `abort` row); it only stops waiting.
            if ChaosRun.objects.filter(pk=run.pk, status=RunStatus.RECOVERING, abort_reason="").update(
                    abort_reason=why) == 1:
                action_create(kind=ABORTED_KIND, actor=actor, deployment=run.deployment, reason=why,
                              status=ActionStatus.SUCCEEDED, idempotency_key=f"chaos-{run.pk}-aborted",
                              params={"chaos_run": run.pk, "event": "chaos_aborted",
                                      "experiment": run.spec.get("name")})
        run.refresh_from_db()
        run_finish(run=run)
        return ChaosRun.objects.get(pk=run.pk)
    raise conflict(f"chaos run {run.pk} is {run.status}: nothing to abort", chaos_run=run.pk)


def run_recovered(*, run: ChaosRun, at) -> bool:
    """The first moment after the revert when the hypothesis held again (set once)."""
    return ChaosRun.objects.filter(pk=run.pk, status=RunStatus.RECOVERING, recovered_at__isnull=True).update(
        recovered_at=at) == 1


def run_finish(*, run: ChaosRun, at=None) -> bool:
    """recovering → finished with its verdict and report (report.run_report), and the `stop` Action; an aborted or
    failed run also notifies every enabled channel (notify.py). False when another driver finished it first."""
    with transaction.atomic():
        locked = ChaosRun.objects.select_for_update().filter(pk=run.pk, status=RunStatus.RECOVERING).first()
        if locked is None:
            return False
        locked.finished_at, locked.status = at or timezone.now(), RunStatus.FINISHED
        report = run_report(locked)
        locked.verdict, locked.report = report["verdict"], report
        locked.save(update_fields=["status", "verdict", "report", "finished_at"])
        action_create(kind=FINISHED_KIND, actor=SYSTEM, deployment=locked.deployment,
                      reason=f"chaos run {locked.pk} finished: {report['verdict']}"
                             + (f" ({'; '.join(report['reasons'])})" if report["reasons"] else ""),
                      status=ActionStatus.SUCCEEDED, idempotency_key=f"chaos-{locked.pk}-finished",
                      params={"chaos_run": locked.pk, "event": "chaos_finished", "experiment": locked.spec.get("name"),
                              "verdict": report["verdict"], "recovery_s": report["recovery_s"]})
        if report["verdict"] in (Verdict.ABORTED, Verdict.FAILED):
            run_end_notify(run=locked, report=report)
    return True

