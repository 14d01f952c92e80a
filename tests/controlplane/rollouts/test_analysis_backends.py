"""Rollout analysis reads the gateway's per-revision counters through the metrics backend, and both backends judge
alike: the embedded one reads the gateway's /metrics itself, the prometheus one reads what a real Prometheus
(Debian's `prometheus`, scraping the same gateway every second with the labels of Tandem's service discovery) last
scraped. The same traffic aborts the same canary with the same numbers, and makes the same A/B report; with
Prometheus unreachable the analysis waits (lacking data never passes)."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Action, ActionKind, Revision, WorkerRole
from controlplane.observability.reader import reader
from controlplane.observability.scraper import Target
from controlplane.rollouts.driver import drive_rollout
from controlplane.rollouts.models import AnalysisRun, Rollout, RolloutStatus, Verdict
from controlplane.rollouts.services import rollout_start
from controlplane.services.revisions import revision_add
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, Prometheus
from tests.controlplane.rollouts.conftest import FakeGatewayMetrics
from tests.procs import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")]
GATEWAY_ID = 9001  # the gateway Worker's id, which Prometheus' target carries as its `worker` label


@pytest.fixture(scope="module")
def gateway():
    """One gateway-style /metrics server for the module: Prometheus scrapes it from the start."""
    server = FakeGatewayMetrics()
    yield server
    server.close()


@pytest.fixture(scope="module")
def scraping(gateway, tmp_path_factory):
    """A real Prometheus scraping the gateway every second, labelled as Tandem's http_sd would label it."""
    directory = tmp_path_factory.mktemp("prometheus-gateway")
    labels = {"deployment": "demo", "pool": "gateway", "worker": str(GATEWAY_ID), "node": "local"}
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "tandem", "static_configs": [
                  {"targets": [f"127.0.0.1:{gateway.port}"], "labels": labels}]}]}
    prometheus = Prometheus(directory / "data", directory, config=config)
    yield prometheus
    prometheus.stop()


@pytest.fixture(params=["embedded", "prometheus"])
def backend(request, settings, scraping):
    settings.TANDEM_METRICS_BACKEND = request.param
    settings.TANDEM_PROMETHEUS_URL = scraping.url if request.param == "prometheus" else ""
    return request.param


@pytest.fixture
def steady(deployment, online_node, make_worker, gateway):
    """`demo` serving revision 1 behind the module's gateway (as tests/controlplane/rollouts/conftest.py's, with
    the gateway's id fixed); revision 2 exists to be tried."""
    gateway.revisions = {}
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    make_worker(deployment, WorkerRole.GATEWAY, port=gateway.port, id=GATEWAY_ID)
    revision_add(deployment=deployment, actor=deployment.created_by, model_path=None, dtype=None,
                 engine_settings={"common": {"threads": 1}}, comment="try me")
    assert Revision.objects.filter(deployment=deployment).count() == 2
    return deployment


def _serve(gateway, deployment, revisions: dict[int, dict]) -> None:
    """The gateway serves these counters from now on; returns once the backend reads them (Prometheus: after its
    next scrape)."""
    gateway.revisions = revisions
    target = Target(GATEWAY_ID, deployment.pk, "gateway", f"http://127.0.0.1:{gateway.port}")
    wanted = {str(r): (float(v.get("ok", 0)), float(v.get("errors", 0))) for r, v in revisions.items()}
    deadline = time.monotonic() + 30
    while True:
        seen = reader().gateway_revisions(target)
        got = {r: (p.counters["success"], p.counters["errors"]) for r, p in (seen or {}).items()}
        if seen is not None and got == wanted:
            return
        assert time.monotonic() < deadline, f"the backend reads {got}, not {wanted}"
        time.sleep(0.2)


def _later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def test_a_failing_canary_aborts_with_the_same_numbers_in_both_backends(backend, steady, gateway, operator,
                                                                         make_tried_ready):
    _serve(gateway, steady, {1: {"ok": 10}, 2: {"ok": 0}})
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, analysis={"interval_s": 1},
                            steps=[{"weight": 10, "duration_s": 600}])
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)  # the baseline
    assert AnalysisRun.objects.get(rollout=rollout).baseline["1"]["c"]["success"] == 10
    _serve(gateway, steady, {1: {"ok": 60, "ttft": 0.03}, 2: {"ok": 2, "errors": 28, "ttft": 0.3}})
    assert drive_rollout(rollout.pk, now=_later(2)) == "aborted"
    run = AnalysisRun.objects.get(rollout=rollout)
    assert (run.metrics["stable"]["requests"], run.metrics["stable"]["errors"]) == (50, 0)
    assert (run.metrics["canary"]["requests"], run.metrics["canary"]["errors"]) == (30, 28)
    assert run.metrics["canary"]["error_ratio"] == pytest.approx(28 / 30)
    # The canary's requests sat in the 0.5 s bucket, stable's in the 0.05 s one: P99 interpolated inside each.
    assert run.metrics["canary"]["ttft_p99_seconds"] == pytest.approx(0.1 + 0.4 * 0.99)
    assert run.metrics["stable"]["ttft_p99_seconds"] == pytest.approx(0.05 * 0.99)
    failed = {f["metric"] for f in Action.objects.get(kind=ActionKind.ABORT).params["failures"]}
    assert failed == {"error_ratio", "server_error_ratio", "ttft_p99_seconds"}
    assert Rollout.objects.get(pk=rollout.pk).status == RolloutStatus.ABORTED


def test_an_ab_experiment_reports_the_same_significance_in_both_backends(backend, steady, gateway, operator,
                                                                         make_tried_ready):
    _serve(gateway, steady, {})
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, strategy="ab", split=50, duration_s=5,
                            analysis={"interval_s": 1})
    make_tried_ready(rollout)
    drive_rollout(rollout.pk)
    assert AnalysisRun.objects.get(rollout=rollout).baseline == {}  # the gateway answered, nothing served yet
    _serve(gateway, steady, {1: {"ok": 100, "e2e": 0.3}, 2: {"ok": 100, "e2e": 3.0}})
    drive_rollout(rollout.pk, now=_later(2))
    assert drive_rollout(rollout.pk, now=_later(6)) == "completed"
    run = AnalysisRun.objects.get(rollout=rollout)
    assert run.verdict == Verdict.REPORT
    assert run.metrics["a"]["requests"] == run.metrics["b"]["requests"] == 100
    assert run.significance["tests"]["e2e_distribution"]["p_value"] < 0.05


def test_with_prometheus_unreachable_the_analysis_waits(steady, gateway, operator, make_tried_ready, settings):
    gateway.revisions = {1: {"ok": 10}, 2: {"ok": 10}}  # the gateway itself answers: the backend does not
    settings.TANDEM_METRICS_BACKEND = "prometheus"
    settings.TANDEM_PROMETHEUS_URL, settings.TANDEM_PROMETHEUS_TIMEOUT_S = f"http://127.0.0.1:{free_port()}", 1
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, analysis={"interval_s": 1},
                            steps=[{"weight": 10, "duration_s": 1}])
    make_tried_ready(rollout)
    assert drive_rollout(rollout.pk) == "in step"
    assert drive_rollout(rollout.pk, now=_later(3)) == "waiting for data"  # its time is up, never judged
    assert not AnalysisRun.objects.filter(rollout=rollout).exists()
    assert Rollout.objects.get(pk=rollout.pk).status == RolloutStatus.RUNNING
