"""The rollout driver: one pass over every running rollout, run by Celery beat every TANDEM_ROLLOUT_INTERVAL_S.

A pass over one rollout (drive_rollout):
1. Wait until every pool has its `tried_replicas` ready workers of the tried revision; then the step's timer
   starts (a step never elapses while its workers start).
2. A step with analysis (and every A/B step): the first pass records the gateway's per-revision counters (read
   through the metrics backend's reader: the gateway itself, or Prometheus' last scrape of it) as the window's
   baseline; each later pass at least `interval_s` after the last compares the tried revision with stable
   over the window (analysis.judge). A failure aborts at once, with the failing numbers.
3. When the step's duration has elapsed: with analysis, only once it is judged (lacking data waits, never passes;
   still lacking it `max_wait_s` after the step's end, the rollout aborts naming what each side served);
   then the next step, and after the last a canary is promoted and an A/B experiment completes with its report.

Idempotent: the state is in the rows, each move is a conditional UPDATE or a row with a unique key (one analysis
run per step, one action per step), so two drivers at once, or a driver killed mid-pass, neither skip nor repeat a
step. The gateway is read before the rollout row is locked, so the lock is never held across HTTP.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.models import Worker, WorkerStatus
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.store import gateway_target
from controlplane.rollouts.analysis import judge, significance, snapshot_of, window_numbers
from controlplane.rollouts.models import AnalysisRun, Rollout, RolloutStatus, Strategy, Verdict
from controlplane.rollouts.selectors import tried_replicas
from controlplane.rollouts.services import rollout_abort, rollout_complete, rollout_promote, rollout_step_advance
from controlplane.services.actions import Actor

log = logging.getLogger(__name__)


def drive_rollouts(*, now=None) -> dict[int, str]:
    """One pass over every running rollout. Returns {rollout id: what the pass did}, for logs and tests."""
    done = {}
    for rollout_id in Rollout.objects.filter(status=RolloutStatus.RUNNING).values_list("id", flat=True):
        try:
            done[rollout_id] = drive_rollout(rollout_id, now=now)
        except Exception:
            # One broken rollout must not stop the others.
            log.exception("driving rollout %s failed", rollout_id)
            done[rollout_id] = "error"
    return done


def gateway_snapshots(deployment_id: int) -> dict[str, dict] | None:
    """The deployment gateway's cumulative request metrics per revision ({"3": snapshot, ...}), through the metrics
    backend's reader; None when there are none to read or the backend does not answer (the analysis then waits:
    lacking data never passes)."""
    gateway = gateway_target(deployment_id)  # its own, or the shared gateway it is attached to
    if gateway is None:
        return None
    try:
        by_revision = reader().gateway_revisions(gateway)
    except MetricsUnavailable as exc:
        log.info("rollout analysis waits: %s", exc)
        return None
    if by_revision is None:
        return None
    return {revision: snapshot_of(part) for revision, part in by_revision.items()}


def _tried_ready(rollout: Rollout) -> bool:
    for pool in rollout.deployment.pools.all():
        ready = Worker.objects.filter(pool=pool, revision=rollout.revision, status=WorkerStatus.READY).count()
        if ready < tried_replicas(pool, rollout):
            return False
    return True


def _analysed(rollout: Rollout) -> bool:
    step = rollout.current_step
    return rollout.strategy == Strategy.AB or bool(step and step.get("analysis"))


def drive_rollout(rollout_id: int, *, now=None) -> str:
    """One pass over one rollout (numbered steps in the module docstring)."""
    now = now or timezone.now()
    rollout = (Rollout.objects.select_related("deployment", "revision", "stable_revision")
               .filter(pk=rollout_id, status=RolloutStatus.RUNNING).first())
    if rollout is None:
        return "not running"
    system = Actor.system("rollout")
    step_index = rollout.step_index
    step = rollout.current_step
    if step is None:
        return _finish(rollout, system)
    if not _tried_ready(rollout):
        return "waiting for workers"
    if rollout.step_started_at is None:
        # Conditional: of two drivers, one starts the timer.
        started = Rollout.objects.filter(pk=rollout.pk, status=RolloutStatus.RUNNING, step_index=step_index,
                                         step_started_at__isnull=True)
        ends_at = now + timedelta(seconds=step["duration_s"] - rollout.step_elapsed_s)
        started.update(step_started_at=now, **({"ends_at": ends_at} if rollout.strategy == Strategy.AB else {}))
        rollout.refresh_from_db()
    run = None
    if _analysed(rollout):
        run, verdict = _analyse(rollout, now)
        if verdict == Verdict.FAILED:
            numbers = "; ".join(f"{f['metric']}: canary {f['canary']:.4g} vs stable {f['stable']:.4g} "
                                f"(limit {f['limit']:.4g})" for f in run.failures)
            rollout_abort(rollout=rollout, actor=system, reason=f"analysis of step {step_index + 1} failed: "
                                                               f"{numbers}", failures=run.failures,
                          idempotency_key=f"rollout-{rollout.pk}-abort-analysis")
            return "aborted"
    if rollout.step_elapsed(now) < step["duration_s"]:
        return "in step"
    if run is not None and rollout.strategy == Strategy.CANARY:
        if run.verdict != Verdict.PASSING:  # the step's time is up but its analysis has not judged yet
            return _wait_for_data(rollout, run, step, now, system)
        AnalysisRun.objects.filter(pk=run.pk, verdict=Verdict.PASSING).update(verdict=Verdict.PASSED,
                                                                              finished_at=now)
    if run is not None and rollout.strategy == Strategy.AB:
        AnalysisRun.objects.filter(pk=run.pk).update(finished_at=now)
    moved = rollout_step_advance(rollout=rollout, from_step=step_index, actor=system,
                                 reason=f"step {step_index + 1} of {len(rollout.steps)} done")
    if not moved:
        return "step taken by another driver"
    if rollout.current_step is None:
        return _finish(rollout, system)
    return "next step"


def _wait_for_data(rollout: Rollout, run: AnalysisRun, step: dict, now, system: Actor) -> str:
    """Wait for the requests the analysis needs, up to max_wait_s past the step's end; then abort, naming what each
    side served (analysis.DEFAULT_CONDITIONS)."""
    conditions = rollout.conditions
    limit, needed = conditions["max_wait_s"], conditions["min_requests"]
    waited = rollout.step_elapsed(now) - step["duration_s"]
    if not limit or waited <= limit or run.verdict != Verdict.WAITING:
        return "waiting for data"
    stable_name, tried_name = rollout.variants
    served = {name: (run.metrics or {}).get(name, {}).get("requests", 0) for name in (stable_name, tried_name)}
    failures = [{"metric": "requests", "stable": served[stable_name], "canary": served[tried_name], "limit": needed,
                 "condition": f"each side serves min_requests within max_wait_s ({limit} s) of the step's end"}]
    rollout_abort(rollout=rollout, actor=system, failures=failures,
                  reason=f"analysis of step {rollout.step_index + 1} judged nothing {limit} s after the step's end: "
                         f"{stable_name} served {served[stable_name]} and {tried_name} {served[tried_name]} requests "
                         f"in its window, {needed} each needed (min_requests)",
                  idempotency_key=f"rollout-{rollout.pk}-abort-no-data")
    return "aborted"


def _finish(rollout: Rollout, system: Actor) -> str:
    if rollout.strategy == Strategy.AB:
        rollout_complete(rollout=rollout, actor=system, reason="the experiment reached its end time; report final")
        return "completed"
    rollout_promote(rollout=rollout, actor=system, reason="every step passed",
                    idempotency_key=f"rollout-{rollout.pk}-promote")
    return "promoted"


def _analyse(rollout: Rollout, now) -> tuple[AnalysisRun, str]:
    """The current step's analysis run, created with the gateway's baseline on its first pass, and evaluated when
    `interval_s` has passed since the last evaluation. Returns (run, verdict)."""
    run = AnalysisRun.objects.filter(rollout=rollout, step_index=rollout.step_index).first()
    if run is None:
        baseline = gateway_snapshots(rollout.deployment_id)
        if baseline is None:
            return AnalysisRun(rollout=rollout, step_index=rollout.step_index), Verdict.WAITING
        try:
            with transaction.atomic():
                run = AnalysisRun.objects.create(rollout=rollout, step_index=rollout.step_index, started_at=now,
                                                 baseline=baseline,
                                                 verdict=Verdict.REPORT if rollout.strategy == Strategy.AB
                                                 else Verdict.WAITING)
        except IntegrityError:  # another driver created it first: its baseline stands
            run = AnalysisRun.objects.get(rollout=rollout, step_index=rollout.step_index)
        return run, run.verdict
    interval = rollout.analysis.get("interval_s", 5)
    if run.evaluated_at is not None and (now - run.evaluated_at).total_seconds() < interval:
        return run, run.verdict
    snapshots = gateway_snapshots(rollout.deployment_id)
    if snapshots is None:
        return run, run.verdict
    stable_key, tried_key = str(rollout.stable_revision.number), str(rollout.revision.number)
    stable = window_numbers(run.baseline.get(stable_key, {}), snapshots.get(stable_key, {}))
    tried = window_numbers(run.baseline.get(tried_key, {}), snapshots.get(tried_key, {}))
    stable_name, tried_name = rollout.variants
    fields = {"evaluated_at": now, "metrics": {stable_name: stable, tried_name: tried}}
    if rollout.strategy == Strategy.AB:
        fields.update(verdict=Verdict.REPORT, significance=significance(stable, tried))
    else:
        verdict, failures, note = judge(stable, tried, rollout.analysis)
        fields.update(verdict=verdict, failures=failures, note=note)
    # Conditional on the evaluation it read: of two drivers evaluating at once, one writes.
    num_updated = AnalysisRun.objects.filter(pk=run.pk, evaluated_at=run.evaluated_at).update(**fields)
    if num_updated:
        for key, value in fields.items():
            setattr(run, key, value)
    else:
        run.refresh_from_db()
    return run, run.verdict
