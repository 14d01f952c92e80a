"""The core of alert evaluation reads alike from both metrics backends: a rule fires once its condition held for its
`for`, resolves when it stops holding, and no data makes no transition. The same pool samples are in the embedded
store and in a real `prometheus` (one per module, over TSDB blocks written as the recording rules would have
written them: tests/controlplane/observability/seeded_prometheus.py); each test reads its own scenario, an hour
ago, ten minutes apart from the others."""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import pytest

from tests.controlplane.alerting.conftest import states
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, PROMTOOL, seed_embedded, serving

pytestmark = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                reason="prometheus/promtool not installed (Debian package `prometheus`)")
T0 = float(math.floor(time.time())) - 3600
# scenario → [(seconds after its start, decode kv_cache_usage_ratio)]: the decode pool's aggregate
SCENARIOS = {
    "for": [(0, 0.95), (10, 0.95), (20, 0.95), (30, 0.97)],
    "resolve": [(0, 0.95), (5, 0.95), (10, 0.2), (20, 0.99)],
    "no data": [],
    "gone": [(0, 0.95)],
}
ROWS = [(T0 + 600 * i + second, "kv_cache_usage_ratio", "decode", None, value)
        for i, points in enumerate(SCENARIOS.values()) for second, value in points]


def at(scenario: str, seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + 600 * list(SCENARIOS).index(scenario) + seconds, tz=timezone.utc)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server = serving(ROWS, tmp_path_factory.mktemp("alert-backends"))
    yield server
    server.stop()


@pytest.fixture(params=["embedded", "prometheus"])
def backend(request, settings, prometheus, quiet_deployment):
    """Every scenario's samples in the test's backend only."""
    settings.TANDEM_METRICS_BACKEND = request.param
    if request.param == "prometheus":
        settings.TANDEM_PROMETHEUS_URL = prometheus.url
    else:
        seed_embedded(quiet_deployment.pk, ROWS)
    return request.param


def test_it_is_pending_until_the_condition_held_for_its_duration_then_fires(backend, quiet_deployment, make_rule,
                                                                             evaluate):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, for_s=30)
    for second in (0, 10, 20):
        evaluate(at("for", second))
        alert = Alert.objects.get(rule=rule)
        assert (alert.state, alert.value) == ("pending", 0.95), f"at {second}s"
    evaluate(at("for", 30))
    alert = Alert.objects.get(rule=rule)
    assert (alert.state, alert.value) == ("firing", 0.97)
    assert alert.active_at == at("for", 0) and alert.fired_at == at("for", 30)
    assert states(rule) == [("inactive", "pending"), ("pending", "firing")]


def test_a_firing_alert_resolves_and_a_new_episode_is_a_new_alert(backend, quiet_deployment, make_rule, evaluate):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, for_s=5)
    for second in (0, 5, 10):
        evaluate(at("resolve", second))
    first = Alert.objects.get(rule=rule)
    assert (first.state, first.fired_at, first.resolved_at) == ("resolved", at("resolve", 5), at("resolve", 10))
    assert first.value == 0.2
    evaluate(at("resolve", 20))
    assert Alert.objects.exclude(pk=first.pk).get(rule=rule).state == "pending"
    assert states(rule) == [("inactive", "pending"), ("pending", "firing"), ("firing", "resolved"),
                            ("inactive", "pending")]


def test_no_data_makes_no_transition(backend, quiet_deployment, make_rule, evaluate):
    from controlplane.alerting.models import Alert

    make_rule(quiet_deployment, comparison="<", threshold=0.5)  # 0 would hold; no data must not
    for second in (0, 30, 60):
        evaluate(at("no data", second))
    assert not Alert.objects.exists()


def test_an_alert_whose_series_disappears_resolves(backend, quiet_deployment, make_rule, evaluate):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, window_s=10)
    evaluate(at("gone", 0))
    evaluate(at("gone", 30))  # no sample in the last 10 s: no data, which does not hold
    assert Alert.objects.get(rule=rule).state == "resolved"
    assert states(rule) == [("inactive", "firing"), ("firing", "resolved")]
