"""The capacity planner's live inputs read through the metrics backend: the same series seeded into the embedded
store and into a real Prometheus (tests/controlplane/observability/seeded_prometheus.py) give the planner the same
traffic and live points, a predictive floor forecasts from Prometheus' history, and a backend that does not answer
is said (503, a note on the page), never read as "no traffic"."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from controlplane.capacity.models import PredictiveScaling, Profile
from controlplane.capacity.selectors import live_points, traffic_from_metrics
from controlplane.capacity.services.bounds import DAY_S, pool_bounds
from controlplane.capacity.services.profiles import profile_live_refine
from controlplane.errors import ControlPlaneError
from controlplane.models import Pool
from controlplane.observability.reader import MetricsUnavailable
from tests.controlplane.observability.seeded_prometheus import (  # noqa: F401  (fixtures)
    backend, seeded, seeded_deployment,
)
from tests.procs import free_port

pytestmark = pytest.mark.integration


def _mean(seeded, metric: str, role: str, window_s: float) -> float:
    values = [row[4] for row in seeded.rows
              if row[1:4] == (metric, role, None) and seeded.t0 - window_s < row[0] <= seeded.t0]
    return sum(values) / len(values)


def test_the_planner_reads_the_same_traffic_and_live_points_from_both_backends(backend, seeded,
                                                                              seeded_deployment):
    now = seeded.t0
    traffic = traffic_from_metrics(deployment=seeded_deployment, hours=0.25, now=now)
    qps = _mean(seeded, "qps", "prefill", 900)
    assert traffic.requests_per_s == pytest.approx(qps, rel=1e-9)
    assert traffic.prompt_tokens_mean == pytest.approx(
        max(1.0, _mean(seeded, "prompt_tokens_per_second", "prefill", 900) / qps), rel=1e-9)
    assert traffic.output_tokens_mean == pytest.approx(
        max(1.0, _mean(seeded, "generation_tokens_per_second", "decode", 900) / qps), rel=1e-9)

    live = live_points(seeded_deployment, window_s=300, now=now)
    [decode] = live["decode"]
    assert decode["qps"] == pytest.approx(_mean(seeded, "qps", "prefill", 300), rel=1e-9)
    assert decode["step_s"] == pytest.approx(_mean(seeded, "itl_p50_seconds", "decode", 300), rel=1e-9)
    assert decode["step_p99_s"] == pytest.approx(_mean(seeded, "itl_p99_seconds", "decode", 300), rel=1e-9)
    running = _mean(seeded, "requests_running", "decode", 300)
    assert decode["batch"] == pytest.approx(round(max(1.0, running / 2), 2))  # two ready decode workers
    for point in live["prefill"]:
        assert point["latency_s"] == pytest.approx(_mean(seeded, "ttft_p50_seconds", "prefill", 300), rel=1e-9)


def test_a_predictive_floor_forecasts_from_prometheus_history(seeded, seeded_deployment, settings):
    settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", seeded.serving.url
    pool = Pool.objects.select_related("deployment").get(deployment=seeded_deployment, role="decode")
    PredictiveScaling.objects.create(pool=pool, enabled=True, lead_time_s=300, history_days=1,
                                     requests_per_replica=0.01)
    # A day after the seeded traffic: the forecast is yesterday's peak over the next 5 minutes, at the entry pool.
    now = datetime.fromtimestamp(seeded.t0 - 300 + DAY_S, tz=timezone.utc)
    bounds = pool_bounds([pool], now=now)[pool.pk]
    peak = max(row[4] for row in seeded.rows
               if row[1:4] == ("qps", "prefill", None) and seeded.t0 - 300 < row[0] <= seeded.t0)
    assert PredictiveScaling.objects.get(pool=pool).last_forecast_rps == pytest.approx(peak, rel=1e-9)
    assert bounds.min_replicas == pool.max_replicas and "predictive floor" in bounds.why


def test_a_backend_that_does_not_answer_is_not_read_as_no_traffic(seeded_deployment, settings, client, viewer):
    url = f"http://127.0.0.1:{free_port()}"
    settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", url
    settings.TANDEM_PROMETHEUS_TIMEOUT_S = 1
    with pytest.raises(ControlPlaneError) as error:
        traffic_from_metrics(deployment=seeded_deployment, hours=1)
    assert error.value.status == 503 and f"Prometheus at {url} did not answer" in error.value.message
    with pytest.raises(MetricsUnavailable):
        live_points(seeded_deployment)
    Profile.objects.create(revision=seeded_deployment.current_revision, role="decode",
                           fits={"decode": {"a": 0.01, "b": 0.001, "c": 0.0}},
                           points={"decode": [{"batch": b, "context": 200, "step_s": 0.01 + 0.001 * b,
                                               "source": "synthetic"} for b in (1, 4, 8)]})
    assert profile_live_refine(deployment=seeded_deployment) == 0  # the refinement pass waits
    client.force_login(viewer)
    page = client.get("/deployments/demo/capacity/")
    assert page.status_code == 200
    assert f"No live points: Prometheus at {url} did not answer".encode() in page.content
