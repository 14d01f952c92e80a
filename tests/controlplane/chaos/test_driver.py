"""The chaos driver's decisions, one pass at a time: a run refuses to start outside steady state (409 naming the
failing check) or without the gateway history its window needs; it injects through the node agent (a real child
process here), reverts at the end of its duration or at once on an abort condition, measures the recovery on what
follows the revert, and gives a verdict with its report."""
from __future__ import annotations

import time

import pytest

from controlplane.chaos.driver import drive_run
from controlplane.chaos.models import ChaosRun, RunStatus, Verdict
from controlplane.chaos.services import chaos_enable, run_abort, run_start
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionKind
from tests.controlplane.chaos.conftest import chaos_pass, process_state, wait_until


def steady_history(gateway, t: float, *, per_step: int = 10) -> int:
    """Scrapes (and driver passes) at t-12, t-8, t-4, t-0.5 of a gateway serving `per_step` more requests each
    time, no errors. Returns the success count reached."""
    ok = 0
    for offset in (12, 8, 4, 0.5):
        ok += per_step
        gateway.serve(ok)
        chaos_pass(now=t - offset)
    return ok


def started(experiment, operator, capture):
    with capture(execute=True):
        return run_start(experiment=experiment, actor=operator)


@pytest.fixture
def capture(django_capture_on_commit_callbacks):
    return django_capture_on_commit_callbacks


def test_it_refuses_to_start_when_the_system_is_not_in_steady_state(experiment, gateway, operator):
    t = time.time()
    for offset, (ok, errors) in zip((12, 8, 4, 0.5), ((10, 0), (20, 3), (30, 6), (40, 9))):
        gateway.serve(ok, errors)
        chaos_pass(now=t - offset)
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=experiment, actor=operator)
    assert refused.value.status == 409 and refused.value.code == "not_steady"
    assert refused.value.extra["failing"][0].startswith("error_ratio (gateway) is 0.2308, needs <= 0.05")
    assert not ChaosRun.objects.exists()


def test_it_refuses_to_start_before_the_gateway_history_covers_the_window(experiment, gateway, operator):
    gateway.serve(10)
    chaos_pass()
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=experiment, actor=operator)
    assert refused.value.code == "not_steady"
    assert "error_ratio: no data in the window" in refused.value.message


def test_it_refuses_a_deployment_that_has_not_opted_in_and_a_second_run(experiment, gateway, operator, admin,
                                                                       agent_inline, capture):
    steady_history(gateway, time.time())
    chaos_enable(deployment=experiment.deployment, enabled=False, actor=admin)
    with pytest.raises(ControlPlaneError) as refused:
        run_start(experiment=experiment, actor=operator)
    assert (refused.value.status, refused.value.code) == (403, "chaos_disabled")
    chaos_enable(deployment=experiment.deployment, enabled=True, actor=admin)
    started(experiment, operator, capture)
    with pytest.raises(ControlPlaneError) as second:
        run_start(experiment=experiment, actor=operator)
    assert second.value.status == 409 and "one at a time" in second.value.message


def test_a_run_pauses_reverts_at_its_end_measures_recovery_and_passes(experiment, world, gateway, operator,
                                                                      agent_inline, capture):
    t = time.time()
    ok = steady_history(gateway, t)
    run = started(experiment, operator, capture)
    pid = world["handle"].pid
    assert [m[0] for m in agent_inline] == ["agent_fault_inject"]
    assert agent_inline[0][2] == world["decode"].node.queue
    wait_until("the decode worker to stop", lambda: process_state(pid) == "stopped")
    start = Action.objects.get(kind=ActionKind.START, params__event="chaos_started")
    assert start.params["chaos_run"] == run.pk and start.params["targets"][0]["worker"] == world["decode"].pk

    # During the fault a fifth of the requests fail: the hypothesis deviates, below the abort condition.
    gateway.serve(ok + 10, errors=3)
    gateway.migrations = 2
    assert chaos_pass(now=t + 2)["runs"] == {run.pk: "in fault"}
    with capture(execute=True):
        assert drive_run(run.pk, now=t + 6) == "reverted"
    wait_until("the decode worker to run again", lambda: process_state(pid) != "stopped")
    run.refresh_from_db()
    assert run.status == RunStatus.RECOVERING and run.timeline[0]["holds"] is False

    # After the revert only new requests count: the errors of the fault are behind the window's start.
    gateway.serve(ok + 20, errors=3)
    chaos_pass(now=t + 7)
    gateway.serve(ok + 30, errors=3)
    assert chaos_pass(now=t + 9)["runs"] == {run.pk: "finished"}
    run.refresh_from_db()
    assert run.status == RunStatus.FINISHED and run.verdict == Verdict.PASSED
    report = run.report
    assert report["recovery_s"] == pytest.approx(3.0, abs=0.01)
    assert report["faults"][0]["injected"]["outcome"] == "paused"
    assert report["faults"][0]["reverted"]["outcome"] == "resumed"
    assert report["hypothesis"]["during"]["held"] < report["hypothesis"]["during"]["passes"]
    assert report["hypothesis"]["after"]["holds"] is True
    assert report["requests"]["sent"] == 33 and report["requests"]["failed"] == 3
    assert report["requests"]["migrated"] == 2
    events = [a["event"] for a in report["actions"] if a["chaos"]]
    assert events == ["chaos_started", "fault_injected", "fault_reverted"]
    assert Action.objects.get(params__event="chaos_finished").params["verdict"] == "passed"


def test_an_abort_condition_reverts_every_fault_at_once(experiment, world, gateway, operator, agent_inline,
                                                      capture):
    t = time.time()
    ok = steady_history(gateway, t)
    run = started(experiment, operator, capture)
    pid = world["handle"].pid
    wait_until("the decode worker to stop", lambda: process_state(pid) == "stopped")
    gateway.serve(ok + 2, errors=20)
    assert chaos_pass(now=t + 1)["runs"] == {run.pk: "in fault"}  # breached, not yet for 4 s
    run.refresh_from_db()
    assert run.breaches == {"0": t + 1}
    gateway.serve(ok + 4, errors=40)
    with capture(execute=True):
        assert chaos_pass(now=t + 5.5)["runs"] == {run.pk: "aborted"}
    wait_until("the decode worker to run again", lambda: process_state(pid) != "stopped")
    run.refresh_from_db()
    assert run.status == RunStatus.RECOVERING and run.abort_reason.startswith("abort condition 1: error_ratio")
    abort = Action.objects.get(kind=ActionKind.ABORT)
    assert abort.params == {"chaos_run": run.pk, "event": "chaos_aborted", "experiment": "pause-decode"}
    gateway.serve(ok + 20, errors=40)
    chaos_pass(now=t + 7)
    gateway.serve(ok + 30, errors=40)
    chaos_pass(now=t + 9)
    run.refresh_from_db()
    assert run.verdict == Verdict.ABORTED and run.report["recovery_s"] is not None


def test_a_run_that_does_not_recover_in_time_fails_and_says_why(experiment, world, gateway, operator,
                                                                agent_inline, capture):
    t = time.time()
    ok = steady_history(gateway, t)
    run = started(experiment, operator, capture)
    with capture(execute=True):
        drive_run(run.pk, now=t + 6)
    for step, now in enumerate((t + 8, t + 20, t + 37)):
        gateway.serve(ok + step, errors=10 + step * 10)  # every new request fails
        chaos_pass(now=now)
    run.refresh_from_db()
    assert run.status == RunStatus.FINISHED and run.verdict == Verdict.FAILED
    assert run.report["recovery_s"] is None
    assert run.report["reasons"] == ["the hypothesis did not hold again within 30 s of the revert"]


def test_a_fault_the_agent_never_confirmed_fails_the_run(experiment, world, gateway, operator, capture):
    t = time.time()
    ok = steady_history(gateway, t)
    with capture(execute=False):  # the broker never delivers: no agent ever hears of the fault
        run = run_start(experiment=experiment, actor=operator)
    drive_run(run.pk, now=t + 6)
    for now in (t + 8, t + 10, t + 40):
        ok += 10
        gateway.serve(ok)
        chaos_pass(now=now)
    run.refresh_from_db()
    assert run.verdict == Verdict.FAILED
    assert f"pause of worker {world['decode'].pk} was not injected (no word from the agent)" in run.report["reasons"]


def test_an_operator_aborts_at_any_moment(experiment, world, gateway, operator, agent_inline, capture):
    t = time.time()
    steady_history(gateway, t)
    run = started(experiment, operator, capture)
    with capture(execute=True):
        run_abort(run=run, actor=operator, reason="enough")
    run.refresh_from_db()
    assert run.status == RunStatus.RECOVERING and run.abort_reason == "enough"
    assert [m[0] for m in agent_inline] == ["agent_fault_inject", "agent_fault_revert"]
    run_abort(run=run, actor=operator)  # recovering: stop waiting
    run.refresh_from_db()
    assert run.status == RunStatus.FINISHED and run.verdict == Verdict.ABORTED
    with pytest.raises(ControlPlaneError) as finished:
        run_abort(run=run, actor=operator)
    assert finished.value.status == 409


def test_a_check_on_a_stored_series_reads_the_pool_aggregate_over_its_window(world):
    from controlplane.chaos.readings import check_values
    from controlplane.chaos.validation import validate_hypothesis
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Sample

    t = time.time()
    deployment = world["deployment"]
    for ts, value in ((t - 20, 0.99), (t - 6, 0.5), (t - 2, 0.7)):
        Sample.objects.create(ts=ts, deployment_id=deployment.pk, role="decode", worker_id=None,
                              metric=METRIC_IDS["kv_cache_usage_ratio"], value=value)
    checks = validate_hypothesis([{"metric": "kv_cache_usage_ratio", "role": "decode", "max": 0.9,
                                   "window_s": 10}], {"prefill", "decode", "gateway"})
    assert checks[0]["aggregation"] == "max"
    assert check_values(deployment.pk, checks, now=t) == [0.7]  # the 0.99 is older than the window
    assert check_values(deployment.pk, checks, now=t, since=t - 3) == [0.7]
