"""A shared gateway's process is scraped per deployment attached to it: one target each, carrying the deployment's
model; its page is fetched once per pass and cut into one reading per model; the process's own series (no `model`)
go to no deployment; each (process, deployment) keeps its own scrape state, gateway counters and tenant usage; and
Prometheus' http_sd lists the process once per deployment, labelled with it."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, ProcessCollector

from controlplane.models import Deployment, SharedGateway, Worker, WorkerRole, WorkerStatus
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.exposition import model_page, parse_exposition
from controlplane.observability.models import GatewayCounters, Sample, ScrapeState
from controlplane.observability.prometheus import SHARED_GATEWAY_RELABEL_CONFIGS, sd_targets
from controlplane.observability.store import scrape_cycle, scrape_targets
from controlplane.tenants.models import TenantUsage
from inference.gateway.metrics import render
from inference.metrics import BASE_LABELS, TandemMetrics
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, Prometheus

T0 = 1_800_000_000.0
MODELS = ("chat", "code")


class SharedPage:
    """A shared gateway's /metrics as its process renders it (inference.gateway.metrics.render): the process's own
    registry (CPU, memory, refusals under model "") merged with one registry per deployment, plus each deployment's
    per-tenant requests."""

    def __init__(self):
        self.own = CollectorRegistry()
        ProcessCollector(registry=self.own)
        self.refusals = Counter("tandem_request_errors", "Requests that failed, by kind.",
                                (*BASE_LABELS, "revision", "kind"), registry=self.own)
        self.served = {model: TandemMetrics(role="gateway", model=model, registry=CollectorRegistry(), gpu=False,
                                            process=False) for model in MODELS}
        self.tenant_requests = {model: 0 for model in MODELS}
        self.num_fetched = 0
        self.queries: list[dict] = []

    def render(self, query: dict | None = None) -> tuple[int, bytes]:
        """The whole page, or with `?deployment=NAME` that deployment's series alone (operator_views.metrics)."""
        self.num_fetched += 1
        wanted = MODELS if not query else [query["deployment"]]
        self.queries.append(query or {})
        registries = [self.served[model].registry for model in wanted]
        page = render(registries if query else [self.own, *registries]).decode()
        page += "".join(f'tandem_gateway_tenant_requests_total{{role="gateway",model="{model}",tenant="acme"}} '
                        f"{self.tenant_requests[model]}\n" for model in wanted)
        return 200, page.encode()


@pytest.fixture
def shared(make_deployment, node, metrics_servers):
    page = SharedPage()
    front = SharedGateway.objects.create(name="front", port=metrics_servers.serve(page.render, with_query=True),
                                         node=node)
    deployments = {model: make_deployment(model, mode="colocated") for model in MODELS}
    Deployment.objects.filter(name__in=MODELS).update(shared_gateway=front, gateway_port=None)
    process = Worker.objects.create(shared_gateway=front, role=WorkerRole.GATEWAY, node=node,
                                    status=WorkerStatus.READY, port=front.port, pid=4242)
    return page, process, deployments


def gateway_value(deployment, metric, worker_id):
    rows = Sample.objects.filter(deployment_id=deployment.pk, role="gateway", worker_id=worker_id,
                                 metric=METRIC_IDS[metric], ts=T0 + 5)
    return rows.values_list("value", flat=True).first()


def test_the_process_is_a_target_per_attached_deployment_with_its_model(shared):
    _, process, deployments = shared
    targets = [t for t in scrape_targets() if t.worker_id == process.pk]
    assert sorted((t.deployment_id, t.model, t.role) for t in targets) == sorted(
        (deployments[model].pk, model, "gateway") for model in MODELS)
    assert len({t.url for t in targets}) == 1


def test_a_page_of_two_models_is_cut_into_two_readings_and_the_process_series_into_none(shared):
    page, _, _ = shared
    page.served["chat"].count_success("stop")
    page.served["code"].count_error("timeout")
    page.refusals.labels(role="gateway", model="", revision="", kind="model_not_found").inc()
    text = page.render()[1].decode()
    chat, code = (parse_exposition(model_page(text, model)) for model in MODELS)
    assert (chat.counters["success"], chat.counters["errors"]) == (1.0, 0.0)
    assert (code.counters["success"], code.counters["errors"]) == (0.0, 1.0)  # not the refusal under model ""
    for reading in (chat, code):
        assert "cpu_seconds" not in reading.counters and "resident_memory_bytes" not in reading.gauges
        assert reading.started_at is not None  # the process's start: how a restart is told apart
    with pytest.raises(ValueError, match="no series of the model 'docs'"):
        model_page(text, "docs")


def test_each_deployment_keeps_its_own_state_series_counters_and_usage_from_one_fetch(shared):
    page, process, deployments = shared
    scrape_cycle(now=T0)
    assert page.num_fetched == 1  # one page for both deployments
    for _ in range(10):
        page.served["chat"].count_success("stop")
    page.served["code"].count_success("stop")
    page.tenant_requests.update(chat=7, code=2)
    result = scrape_cycle(now=T0 + 5)
    assert (result.num_targets, result.num_up, page.num_fetched) == (2, 2, 2)

    chat, code = deployments["chat"], deployments["code"]
    assert gateway_value(chat, "qps", process.pk) == pytest.approx(2.0)
    assert gateway_value(code, "qps", process.pk) == pytest.approx(0.2)
    # The process's CPU and memory belong to no deployment.
    assert not Sample.objects.filter(metric__in=[METRIC_IDS["cpu_usage_ratio"], METRIC_IDS["resident_memory_bytes"]],
                                     worker_id=process.pk).exists()
    assert sorted(ScrapeState.objects.filter(worker_id=process.pk).values_list("deployment_id", flat=True)) == sorted(
        [chat.pk, code.pk])
    last = {row.deployment_id: row.snapshot["c"]["success"]
            for row in GatewayCounters.objects.filter(worker_id=process.pk, ts=T0 + 5)}
    assert last == {chat.pk: 10.0, code.pk: 1.0}
    usage = dict(TenantUsage.objects.filter(tenant="acme").values_list("deployment_id", "requests"))
    assert usage == {chat.pk: 7, code.pk: 2}


def test_a_failed_process_is_down_for_each_deployment(shared):
    _, process, deployments = shared
    Worker.objects.filter(pk=process.pk).update(status=WorkerStatus.FAILED)
    result = scrape_cycle(now=T0 + 5)
    assert (result.num_targets, result.num_up) == (2, 0)
    for deployment in deployments.values():
        assert gateway_value(deployment, "up", process.pk) == 0.0


def test_http_sd_lists_the_process_once_per_deployment_labelled_with_it(shared):
    _, process, _ = shared
    groups = [group for group in sd_targets() if group["labels"]["worker"] == str(process.pk)]
    assert [(group["labels"]["deployment"], group["labels"]["shared_gateway"], group["labels"]["pool"],
             group["labels"]["__param_deployment"]) for group in groups] == [
        ("chat", "front", "gateway", "chat"), ("code", "front", "gateway", "code")]
    assert len({group["targets"][0] for group in groups}) == 1


@pytest.mark.integration
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")
def test_prometheus_reads_each_deployments_series_from_its_own_page(shared, tmp_path):
    """A real Prometheus with the http_sd groups asks the process for one deployment's page per group (it used to
    fetch the whole page once per attached deployment and drop the others' series), and each series lands under
    its deployment; the process's own series under none."""
    page, process, _ = shared
    for _ in range(3):
        page.served["chat"].count_success("stop")
    page.served["code"].count_success("stop")
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "tandem", "static_configs": sd_targets(),
                                  "metric_relabel_configs": SHARED_GATEWAY_RELABEL_CONFIGS}]}
    prometheus = Prometheus(tmp_path / "data", tmp_path, config=config)
    try:
        deadline, found = time.monotonic() + 30, {}
        while len(found) < 2:
            assert time.monotonic() < deadline, f"Prometheus has {found}; its log: {prometheus.log.read_text()}"
            time.sleep(0.2)
            answer = requests.get(f"{prometheus.url}/api/v1/query", timeout=5, params={
                "query": f'sum by (deployment, model) (tandem_request_success_total{{worker="{process.pk}"}})'})
            found = {(r["metric"]["deployment"], r["metric"]["model"]): float(r["value"][1])
                     for r in answer.json()["data"]["result"]}
        assert found == {("chat", "chat"): 3.0, ("code", "code"): 1.0}
        own = requests.get(f"{prometheus.url}/api/v1/query", timeout=5,
                           params={"query": "process_cpu_seconds_total"}).json()["data"]["result"]
        assert own == []
    finally:
        prometheus.stop()
    assert page.queries and {query.get("deployment") for query in page.queries} == {"chat", "code"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_accepts_the_shared_gateway_relabelling(tmp_path):
    job = {"job_name": "tandem", "static_configs": [{"targets": ["127.0.0.1:9"], "labels": {"deployment": "chat"}}],
           "metric_relabel_configs": SHARED_GATEWAY_RELABEL_CONFIGS}
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps({"scrape_configs": [job]}))
    out = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_readers_find_a_deployments_gateway_own_or_shared(shared, make_deployment, make_worker):
    """What chaos and rollouts read a deployment's gateway through: its own process, else its shared gateway's,
    reading the deployment's model."""
    from controlplane.observability.store import gateway_target

    _, process, deployments = shared
    target = gateway_target(deployments["code"].id)
    assert (target.worker_id, target.deployment_id, target.model) == (process.id, deployments["code"].id, "code")
    alone = make_deployment("alone", mode="colocated")
    assert gateway_target(alone.id) is None
    own = make_worker(alone, WorkerRole.GATEWAY, status=WorkerStatus.STARTING)
    target = gateway_target(alone.id)
    assert (target.worker_id, target.model) == (own.id, "")
    Worker.objects.filter(pk=process.pk).update(status=WorkerStatus.STOPPED)
    assert gateway_target(deployments["code"].id) is None
