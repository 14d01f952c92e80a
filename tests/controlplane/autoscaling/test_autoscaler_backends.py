"""The autoscaler's core decisions read alike from both metrics backends: a P99 over its target scales the pool up
by the bounded step and holds while the new workers start, a value within tolerance or no data writes nothing, and
an idle pool shrinks to its min after the down window. The same pool samples are in the embedded store and in a
real `prometheus` (one per module, over TSDB blocks written as the recording rules would have written them:
tests/controlplane/observability/seeded_prometheus.py); each test reads its own scenario, an hour ago, ten minutes
apart from the others."""
from __future__ import annotations

import math
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.models import Action, ActorType
from controlplane.services import pool_scale
from tests.controlplane.autoscaling.support import pool_of
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, PROMTOOL, seed_embedded, serving

pytestmark = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                reason="prometheus/promtool not installed (Debian package `prometheus`)")
T0 = float(math.floor(time.time())) - 3600
# scenario → [(seconds after its start, pool, series, value)]: pool aggregates
SCENARIOS = {
    "slow": [(-1, "decode", "itl_p99_seconds", 0.3)],  # default decode target: 100 ms
    "tolerance": [(99, "decode", "itl_p99_seconds", 0.105)],
    "idle": [(-1, "decode", "qps", 0.0), (150, "decode", "qps", 0.0), (300, "decode", "qps", 0.0)],
}
ROWS = [(T0 + 600 * i + second, metric, role, None, value)
        for i, points in enumerate(SCENARIOS.values()) for second, role, metric, value in points]


def at(scenario: str, seconds: float = 0) -> float:
    return T0 + 600 * list(SCENARIOS).index(scenario) + seconds


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server = serving(ROWS, tmp_path_factory.mktemp("autoscaler-backends"))
    yield server
    server.stop()


@pytest.fixture(params=["embedded", "prometheus"])
def scaled(request, settings, prometheus, deployment, make_worker):
    """`demo` autoscaled with one ready decode worker, every scenario's samples in the test's backend only."""
    settings.TANDEM_METRICS_BACKEND = request.param
    if request.param == "prometheus":
        settings.TANDEM_PROMETHEUS_URL = prometheus.url
    else:
        seed_embedded(deployment.pk, ROWS)
    deployment.autoscale_enabled = True
    deployment.save()
    make_worker(deployment, "decode")
    return deployment


def autoscaler_actions(deployment):
    return Action.objects.filter(deployment=deployment, kind="scale", actor_type=ActorType.AUTOSCALER)


def test_p99_itl_three_times_the_target_scales_decode_up_by_the_bounded_step_then_holds(scaled, settings):
    settings.TANDEM_AUTOSCALE_MAX_STEP = 2
    decision = autoscale_pool(pool_of(scaled), now=at("slow"))
    assert decision.desired == 3  # ceil(1 × 3) = 3, within the step of ±2
    [action] = autoscaler_actions(scaled)
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert "itl_p99_seconds 0.3 vs target 0.1" in action.reason
    settings.TANDEM_AUTOSCALE_MAX_STEP = 10  # so that only the hold stops the second step
    held = autoscale_pool(pool_of(scaled), now=at("slow", 5))  # still 1 of 3 ready, still slow
    assert held.desired == 3 and "held: 1 of 3 workers ready" in held.reason
    assert autoscaler_actions(scaled).count() == 1


def test_within_tolerance_or_without_data_nothing_is_written(scaled):
    assert autoscale_pool(pool_of(scaled), now=at("tolerance")).desired == 1  # no sample in the window: no data
    decision = autoscale_pool(pool_of(scaled), now=at("tolerance", 100))
    assert not decision.changes and "within tolerance" in decision.reason
    assert not autoscaler_actions(scaled).exists()


def test_an_idle_pool_shrinks_to_its_min_after_the_down_window(scaled, operator, settings):
    settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S = 0  # the setup scale below must not pause the test
    pool_scale(deployment=scaled, role="decode", replicas=3, actor=operator)
    first = autoscale_pool(pool_of(scaled), now=at("idle"))
    assert first.desired == 3 and first.raw == 0  # served nothing: latency has no data, read as 0
    assert autoscale_pool(pool_of(scaled), now=at("idle", 150)).desired == 3  # 3 is still in the down window
    last = autoscale_pool(pool_of(scaled), now=at("idle", 301))  # only zeros left in it: down to min, 1
    assert last.desired == 1
