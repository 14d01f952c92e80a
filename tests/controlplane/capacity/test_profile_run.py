"""A profile run against real tiny-model workers started for it by the node agent: points at every level, fitted
curves, KV bytes per token from the worker's layout, the serving pools untouched, and the profiling workers (rows of
purpose `profile` on the node, out of the membership) stopped afterwards."""
import psutil
import pytest

from controlplane.capacity.models import Profile, ProfileJob, ProfileJobStatus
from controlplane.capacity.services.profile_jobs import profile_job_create, profile_job_run
from controlplane.capacity.sizing.curves import DecodeCurve
from controlplane.models import Worker

pytestmark = pytest.mark.integration


@pytest.fixture
def tiny_deployment(transactional_db, online_node, make_deployment, tiny_model_dir, monkeypatch):
    """A tiny-model deployment whose reconcile never runs (so no serving worker starts: the run makes its own), and
    the node agent of node `local` carrying out its tasks here and now when they are sent (Celery's
    task_always_eager): a real worker process per start, stopped by its stop task. Transactional: tasks are sent
    on commit."""
    from controlplane.celery import app
    from controlplane.supervision import tasks

    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", lambda *args, **kwargs: None)
    deployment = make_deployment("tiny", model_path=str(tiny_model_dir), dtype="float32",
                                 engine_settings={"threads": 1, "kv_cache_bytes": 8 << 20})
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield deployment
    app.conf.task_always_eager = previous


def test_a_quick_profile_measures_both_stages_and_stores_them_per_role(tiny_deployment, online_node, settings,
                                                                      tmp_path):
    settings.TANDEM_LOG_DIR = tmp_path
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    seen = []
    job = profile_job_create(deployment=tiny_deployment, quick=True, enqueue=False)
    job = profile_job_run(job.pk, echo=lambda fraction, step: seen.append((fraction, step)))
    assert job.status == ProfileJobStatus.SUCCEEDED, job.error
    # Its workers were the node agent's: one per role on the node, in no pool, stopped, logged as profile workers.
    started = Worker.objects.filter(deployment=tiny_deployment, purpose="profile")
    assert sorted(started.values_list("role", flat=True)) == ["decode", "prefill"]
    assert all(w.node == online_node and w.pool is None and w.status == "stopped" and w.pid
               and "profile-tiny-" in w.log_path for w in started)
    assert job.progress == 1.0 and seen[-1][0] == 1.0
    assert any(step.startswith("decode: 4 sequences") for _, step in seen)
    prefill = Profile.objects.get(revision=tiny_deployment.current_revision, role="prefill")
    decode = Profile.objects.get(revision=tiny_deployment.current_revision, role="decode")
    assert set(prefill.points) == {"prefill"} and set(decode.points) == {"decode", "saturation"}
    assert len(prefill.points["prefill"]) == 6  # 3 prompt lengths × batches of 1 and 4
    assert len(decode.points["decode"]) == 4  # 2 contexts × 1 and 4 sequences
    longest = max(prefill.points["prefill"], key=lambda p: p["batch_tokens"])
    shortest = min(prefill.points["prefill"], key=lambda p: p["batch_tokens"])
    assert longest["batch_tokens"] > 4 * shortest["batch_tokens"]
    fit = prefill.fits["prefill"]
    # A prompt takes time; whether the tiny model's millisecond prompts show a slope over a loaded machine's noise is
    # the fit's choice (CI once fitted all of it into the constant term): the fit's maths is tested on set points.
    assert fit["a"] >= 0 and fit["b"] >= 0 and fit["a"] + fit["b"] + fit["c"] > 0
    # A step of one sequence takes time; which term carries it is the noisy fit's choice on a loaded machine.
    assert DecodeCurve(**decode.fits["decode"]).step_seconds(1, 64) > 0
    assert "kv_transfer" in decode.fits  # the decode levels went through the prefill worker's KV push
    [burst] = decode.points["saturation"]
    assert burst["requests"] == 8 and burst["wall_s"] > 0  # twice the highest concurrency, at once
    assert decode.fits["overhead"]["request_s"] == burst["request_overhead_s"] >= 0
    info = decode.info["kv_layout"]
    assert decode.kv_bytes_per_token == 2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"] * 4
    assert decode.max_num_seqs == decode.info["max_num_seqs"] and decode.kv_capacity_tokens > 0
    assert not Worker.objects.filter(deployment=tiny_deployment, purpose="serving").exists()  # no serving row made
    alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in children_before and p.is_running()
             and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []  # the profiling workers were stopped


def test_a_second_job_while_one_is_pending_is_refused(tiny_deployment):
    profile_job_create(deployment=tiny_deployment, quick=True, enqueue=False)
    from controlplane.errors import ControlPlaneError

    with pytest.raises(ControlPlaneError, match="still pending") as err:
        profile_job_create(deployment=tiny_deployment, quick=True, enqueue=False)
    assert err.value.status == 409
    assert ProfileJob.objects.filter(deployment=tiny_deployment).count() == 1


def test_a_profiling_worker_that_dies_fails_the_run_with_its_reason_and_is_stopped(
        transactional_db, online_node, make_deployment, model_dir, monkeypatch, settings, tmp_path):
    """The node agent's heartbeat sees the worker exit (a folder with only a config.json is no model) and reports
    it, as for any worker; the run fails at once with that reason instead of waiting out its ready timeout."""
    import time

    from controlplane.agent.node import Heartbeat
    from controlplane.celery import app
    from controlplane.supervision import tasks

    settings.TANDEM_LOG_DIR = tmp_path
    monkeypatch.setattr(tasks.reconcile_deployment, "apply_async", lambda *args, **kwargs: None)
    deployment = make_deployment("broken", model_path=str(model_dir), engine_settings={"threads": 1})
    heartbeat = Heartbeat(online_node, 0.3)
    heartbeat.start()
    previous, app.conf.task_always_eager = app.conf.task_always_eager, True
    try:
        job = profile_job_create(deployment=deployment, quick=True, enqueue=False)
        started = time.monotonic()
        job = profile_job_run(job.pk)
    finally:
        app.conf.task_always_eager = previous
        heartbeat.stop()
        heartbeat.join(5)
    assert job.status == ProfileJobStatus.FAILED
    assert "prefill profiling worker" in job.error and "exited" in job.error, job.error
    assert time.monotonic() - started < 120  # the exit ended the wait, not the 180 s ready timeout
    rows = Worker.objects.filter(deployment=deployment, purpose="profile")
    assert rows.count() == 1 and rows.get().status == "stopped"  # the decode worker was never started
