"""The periodic tasks (run in-process, one pass each): a cycle scrapes, stores and records its duration for
/metrics; the rollup task rolls up and prunes."""
from prometheus_client import CollectorRegistry

from controlplane.observability.models import CycleKind, CycleStat, Sample
from controlplane.observability.tasks import rollup_and_prune_task, scrape_cycle_task
from inference.metrics import TandemMetrics


def test_a_cycle_scrapes_stores_and_records_its_duration(deployment, make_worker, metrics_servers):
    metrics = TandemMetrics(role="prefill", model="tiny", registry=CollectorRegistry(), gpu=False)
    make_worker(deployment, "prefill", port=metrics_servers.serve_metrics(metrics))
    result = scrape_cycle_task()
    assert (result["targets"], result["up"]) == (1, 1)
    assert Sample.objects.count() == result["samples"] > 0
    scrape = CycleStat.objects.get(kind=CycleKind.SCRAPE)
    assert (scrape.count, scrape.last_targets, scrape.last_targets_up) == (1, 1, 1)


def test_the_rollup_task_runs_on_an_empty_store(db):
    assert rollup_and_prune_task() == {"rollups": 0, "deleted": {"samples": 0, "revision_samples": 0,
                                                                 "tenant_samples": 0, "gateway_counters": 0,
                                                                 "rollups": 0,
                                                                 "scrape_states": 0, "tenant_usage": 0}}
    assert CycleStat.objects.get(kind=CycleKind.ROLLUP).count == 1
