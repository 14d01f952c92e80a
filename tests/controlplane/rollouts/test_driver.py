"""The rollout driver one pass at a time: steps wait for the tried workers, analysis waits for data, a failure
aborts with its numbers, the last step promotes, an A/B experiment completes with a report and never promotes, and
two drivers at once neither skip nor repeat a step."""
from __future__ import annotations

import threading
from datetime import timedelta

from django.db import close_old_connections
from django.utils import timezone

from controlplane.models import Action, ActionKind, ActionStatus
from controlplane.rollouts.driver import drive_rollout
from controlplane.rollouts.models import AnalysisRun, Rollout, RolloutStatus, Verdict
from controlplane.rollouts.services import rollout_pause, rollout_resume, rollout_start


def _canary(steady, operator, steps, **analysis):
    return rollout_start(deployment=steady, actor=operator, revision=2, steps=steps,
                         analysis={"interval_s": 1, **analysis})


def _later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def test_the_step_timer_waits_for_the_tried_workers(steady, operator, make_tried_ready):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 5, "analysis": False}])
    assert drive_rollout(rollout.pk) == "waiting for workers"
    assert Rollout.objects.get(pk=rollout.pk).step_started_at is None
    make_tried_ready(rollout)
    assert drive_rollout(rollout.pk) == "in step"
    assert Rollout.objects.get(pk=rollout.pk).step_started_at is not None


def test_pause_steps_advance_on_time_and_the_last_promotes(steady, operator, make_tried_ready):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 5, "analysis": False},
                                         {"weight": 50, "duration_s": 5, "analysis": False}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    assert drive_rollout(rollout.pk, now=_later(2)) == "in step"
    assert drive_rollout(rollout.pk, now=_later(6)) == "next step"
    rollout.refresh_from_db()
    assert (rollout.step_index, rollout.weight) == (1, 50)
    drive_rollout(rollout.pk, now=_later(6))  # starts step 2's timer
    assert drive_rollout(rollout.pk, now=_later(12)) == "promoted"
    rollout.refresh_from_db()
    steady.refresh_from_db()
    assert rollout.status == RolloutStatus.PROMOTED and steady.current_revision.number == 2
    promote = Action.objects.get(kind=ActionKind.PROMOTE)
    assert promote.status == ActionStatus.RUNNING and promote.params["to_revision"] == 2
    steps = Action.objects.filter(kind=ActionKind.ROLLOUT, params__event="step").count()
    assert steps == 2


def test_analysis_without_data_waits_past_the_step_end_and_never_passes(steady, operator, make_tried_ready,
                                                                        gateway_metrics):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 2}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)  # timer and baseline
    assert drive_rollout(rollout.pk, now=_later(5)) == "waiting for data"
    run = AnalysisRun.objects.get(rollout=rollout)
    assert run.verdict == Verdict.WAITING
    assert Rollout.objects.get(pk=rollout.pk).status == RolloutStatus.RUNNING

    gateway_metrics.revisions = {1: {"ok": 40, "ttft": 0.03}, 2: {"ok": 25, "ttft": 0.03}}
    assert drive_rollout(rollout.pk, now=_later(7)) == "promoted"
    run.refresh_from_db()
    assert run.verdict == Verdict.PASSED
    assert run.metrics["canary"]["requests"] == 25 and run.metrics["stable"]["requests"] == 40


def test_analysis_still_without_data_max_wait_s_after_the_step_end_aborts_naming_what_each_side_served(
        steady, operator, make_tried_ready, gateway_metrics):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 2}], max_wait_s=10)
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)  # timer and baseline
    gateway_metrics.revisions = {1: {"ok": 40}, 2: {"ok": 3}}
    assert drive_rollout(rollout.pk, now=_later(11)) == "waiting for data"  # 9 s past the step's end
    assert drive_rollout(rollout.pk, now=_later(13)) == "aborted"
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.ABORTED and rollout.weight == 0
    abort = Action.objects.get(kind=ActionKind.ABORT)
    assert abort.params["failures"] == [{"metric": "requests", "stable": 40, "canary": 3, "limit": 20,
                                         "condition": "each side serves min_requests within max_wait_s (10 s) of "
                                                      "the step's end"}]
    assert "judged nothing 10 s after the step's end" in abort.reason and "canary 3" in abort.reason
    steady.refresh_from_db()
    assert steady.current_revision.number == 1


def test_max_wait_s_0_waits_for_data_for_ever(steady, operator, make_tried_ready, gateway_metrics):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 2}], max_wait_s=0)
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    assert drive_rollout(rollout.pk, now=_later(30 * 24 * 3600)) == "waiting for data"
    assert Rollout.objects.get(pk=rollout.pk).status == RolloutStatus.RUNNING


def test_a_failing_analysis_aborts_at_once_with_the_failing_numbers(steady, operator, make_tried_ready,
                                                                   gateway_metrics, settings):
    from controlplane.alerting.models import Channel, Delivery

    Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/hook")
    gateway_metrics.revisions = {1: {"ok": 10}, 2: {"ok": 0}}
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 600}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)  # baseline
    gateway_metrics.revisions = {1: {"ok": 60}, 2: {"ok": 2, "errors": 28}}
    assert drive_rollout(rollout.pk, now=_later(2)) == "aborted"
    rollout.refresh_from_db()
    assert rollout.status == RolloutStatus.ABORTED and rollout.weight == 0
    abort = Action.objects.get(kind=ActionKind.ABORT)
    failed = {f["metric"]: f for f in abort.params["failures"]}
    assert failed["error_ratio"]["canary"] > 0.9 and failed["error_ratio"]["stable"] == 0.0
    assert "error_ratio" in abort.reason
    delivery = Delivery.objects.get()
    assert delivery.event == "aborted" and delivery.payload["failures"] == abort.params["failures"]
    assert abort.result == {"deliveries": [delivery.pk]}  # the action names the notifications it queued
    steady.refresh_from_db()
    assert steady.current_revision.number == 1


def test_a_paused_step_keeps_its_elapsed_time(steady, operator, make_tried_ready):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 10, "analysis": False}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=_later(-4))
    rollout_pause(rollout=Rollout.objects.get(pk=rollout.pk), actor=operator)
    paused = Rollout.objects.get(pk=rollout.pk)
    assert paused.status == RolloutStatus.PAUSED and 3.5 < paused.step_elapsed_s < 6.5  # 4 s, and a loaded host
    assert drive_rollout(rollout.pk, now=_later(60)) == "not running"
    rollout_resume(rollout=paused, actor=operator)
    drive_rollout(rollout.pk)
    assert drive_rollout(rollout.pk, now=_later(3)) == "in step"
    assert drive_rollout(rollout.pk, now=_later(7)) == "promoted"


def test_an_ab_experiment_completes_with_a_report_and_never_promotes(steady, operator, make_tried_ready,
                                                                    gateway_metrics):
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, strategy="ab", split=50, duration_s=5,
                            analysis={"interval_s": 1})
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    assert Rollout.objects.get(pk=rollout.pk).ends_at is not None
    gateway_metrics.revisions = {1: {"ok": 100, "e2e": 0.3}, 2: {"ok": 100, "e2e": 3.0}}
    drive_rollout(rollout.pk, now=_later(2))
    assert drive_rollout(rollout.pk, now=_later(6)) == "completed"
    rollout.refresh_from_db()
    steady.refresh_from_db()
    assert rollout.status == RolloutStatus.COMPLETED and steady.current_revision.number == 1
    run = AnalysisRun.objects.get(rollout=rollout)
    assert run.verdict == Verdict.REPORT and set(run.metrics) == {"a", "b"}
    assert run.significance["tests"]["e2e_distribution"]["p_value"] < 0.05
    assert not Action.objects.filter(kind=ActionKind.PROMOTE).exists()


def test_two_drivers_at_once_advance_a_step_once(steady, operator, make_tried_ready, transactional_db):
    rollout = _canary(steady, operator, [{"weight": 10, "duration_s": 1, "analysis": False},
                                         {"weight": 50, "duration_s": 600, "analysis": False}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    results, barrier = [], threading.Barrier(2)

    def drive():
        barrier.wait()
        try:
            results.append(drive_rollout(rollout.pk, now=_later(3)))
        finally:
            close_old_connections()

    threads = [threading.Thread(target=drive) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    rollout.refresh_from_db()
    assert rollout.step_index == 1, results
    assert Action.objects.filter(kind=ActionKind.ROLLOUT, params__event="step").count() == 1
    assert "next step" in results
