"""A profile run against real tiny-model workers started for it: points at every level, fitted curves, KV bytes
per token from the worker's layout, the serving pools untouched, and the profiling workers gone afterwards."""
import psutil
import pytest

from controlplane.capacity.models import Profile, ProfileJob, ProfileJobStatus
from controlplane.capacity.services.profile_jobs import profile_job_create, profile_job_run
from controlplane.models import Worker

pytestmark = pytest.mark.integration


@pytest.fixture
def tiny_deployment(make_deployment, tiny_model_dir):
    return make_deployment("tiny", model_path=str(tiny_model_dir), dtype="float32",
                           engine_settings={"threads": 1, "kv_cache_bytes": 8 << 20})


def test_a_quick_profile_measures_both_stages_and_stores_them_per_role(tiny_deployment, settings, tmp_path):
    settings.TANDEM_LOG_DIR = tmp_path
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    seen = []
    job = profile_job_create(deployment=tiny_deployment, quick=True, enqueue=False)
    job = profile_job_run(job.pk, echo=lambda fraction, step: seen.append((fraction, step)))
    assert job.status == ProfileJobStatus.SUCCEEDED, job.error
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
    assert fit["a"] >= 0 and fit["b"] >= 0 and fit["b"] + fit["c"] > 0  # longer prompts cost more
    assert decode.fits["decode"]["a"] > 0
    assert "kv_transfer" in decode.fits  # the decode levels went through the prefill worker's KV push
    [burst] = decode.points["saturation"]
    assert burst["requests"] == 8 and burst["wall_s"] > 0  # twice the highest concurrency, at once
    assert decode.fits["overhead"]["request_s"] == burst["request_overhead_s"] >= 0
    info = decode.info["kv_layout"]
    assert decode.kv_bytes_per_token == 2 * info["num_layers"] * info["num_kv_heads"] * info["head_dim"] * 4
    assert decode.max_num_seqs == decode.info["max_num_seqs"] and decode.kv_capacity_tokens > 0
    assert not Worker.objects.filter(deployment=tiny_deployment, status="ready").exists()  # none of the serving rows
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
