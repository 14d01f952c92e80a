"""Live refinement: scraped P50s at the observed load become "live" points of the current revision's profiles;
live decode points join the decode fit, live prefill points (TTFT includes queueing) do not."""
import time

from controlplane.capacity.models import Profile
from controlplane.capacity.services.profiles import profile_live_refine
from controlplane.capacity.sizing.curves import DecodeCurve
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample


def observe(deployment, role, metric, value, at):
    Sample.objects.create(ts=at, deployment_id=deployment.pk, role=role, worker_id=None, metric=METRIC_IDS[metric],
                          value=value)


def synthetic_decode():
    return [{"batch": b, "context": 64, "step_s": 0.01 + 0.001 * b, "source": "synthetic"} for b in (1, 2, 4)]


def test_scraped_latencies_become_live_points_and_refine_the_decode_fit(deployment, make_worker):
    revision = deployment.current_revision
    prefill = Profile.objects.create(revision=revision, role="prefill", points={"prefill": [
        {"prompt_tokens": n, "batch": 1, "batch_tokens": n, "latency_s": 0.01 + 1e-4 * n, "source": "synthetic"}
        for n in (16, 64, 256)]}, fits={"prefill": {"a": 0.01, "b": 1e-4, "c": 0.0}})
    decode = Profile.objects.create(revision=revision, role="decode", points={"decode": synthetic_decode()},
                                    fits={"decode": {"a": 0.01, "b": 0.001, "c": 0.0}})
    for _ in range(2):
        make_worker(deployment, "decode")
    now = time.time()
    for offset in (10, 40):
        observe(deployment, "prefill", "qps", 4.0, now - offset)
        observe(deployment, "prefill", "prompt_tokens_per_second", 400.0, now - offset)  # 100-token prompts
        observe(deployment, "prefill", "ttft_p50_seconds", 0.5, now - offset)
        observe(deployment, "decode", "generation_tokens_per_second", 80.0, now - offset)  # 20-token outputs
        observe(deployment, "decode", "itl_p50_seconds", 0.05, now - offset)  # slower than the synthetic curve
        observe(deployment, "decode", "itl_p99_seconds", 0.09, now - offset)
        observe(deployment, "decode", "requests_running", 16.0, now - offset)  # 8 per ready decode worker
    assert profile_live_refine(deployment=deployment, window_s=120, now=now) == 2
    decode.refresh_from_db()
    prefill.refresh_from_db()
    [live] = [p for p in decode.points["decode"] if p["source"] == "live"]
    assert (live["batch"], live["context"], live["step_s"], live["step_p99_s"]) == (8.0, 110, 0.05, 0.09)
    refined = DecodeCurve(**decode.fits["decode"])
    assert refined.step_seconds(8, 110) > 0.01 + 0.001 * 8  # the slow live point pulled the curve up there
    [live_prefill] = [p for p in prefill.points["prefill"] if p["source"] == "live"]
    assert live_prefill["prompt_tokens"] == 100 and live_prefill["latency_s"] == 0.5
    assert prefill.fits["prefill"]["a"] < 0.02  # the live TTFT (with queueing) stayed out of the fit


def test_without_traffic_nothing_is_added(deployment):
    Profile.objects.create(revision=deployment.current_revision, role="decode", points={"decode": synthetic_decode()})
    assert profile_live_refine(deployment=deployment, window_s=120) == 0
    assert all(p["source"] == "synthetic" for p in Profile.objects.get().points["decode"])
