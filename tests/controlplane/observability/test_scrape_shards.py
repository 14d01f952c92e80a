"""A large fleet's scrape split in shards (settings.TANDEM_SCRAPE_SHARDS): each pass scrapes the deployments whose id
modulo the number of shards is its own, with all of a pool's workers in one pass (its aggregate series), and
/metrics counts the targets of the latest pass of every shard together."""
import pytest
from prometheus_client import CollectorRegistry

from controlplane.observability.models import CycleKind, CycleStat, Sample
from controlplane.observability.store import Shard
from controlplane.observability.tasks import scrape_cycle_task
from controlplane.observability.telemetry import REGISTRY
from inference.metrics import TandemMetrics
from tests.procs import free_port


@pytest.fixture
def two_deployments(make_deployment, make_worker, metrics_servers):
    """One even and one odd deployment id: 2 live decode workers in the first, 1 live + 1 dead in the second."""
    first = make_deployment("first")
    second = make_deployment("second")
    if first.pk % 2 == second.pk % 2:  # ids are consecutive in practice; make sure of the parity anyway
        second = make_deployment("third")
    even, odd = sorted((first, second), key=lambda d: d.pk % 2)

    def live(deployment):
        metrics = TandemMetrics(role="decode", model="tiny", registry=CollectorRegistry(), gpu=False)
        return make_worker(deployment, "decode", port=metrics_servers.serve_metrics(metrics))

    return {even: [live(even), live(even)], odd: [live(odd), make_worker(odd, "decode", port=free_port())]}


def _scraped(deployment) -> set[int]:
    return set(Sample.objects.filter(deployment_id=deployment.pk, worker_id__isnull=False)
               .values_list("worker_id", flat=True))


def _targets_gauge() -> dict[str, float]:
    return {sample.labels["up"]: sample.value for family in REGISTRY.collect()
            if family.name == "tandem_controlplane_scrape_targets" for sample in family.samples}


def test_each_shard_scrapes_its_own_deployments_and_the_gauge_sums_them(two_deployments):
    (even, even_workers), (odd, odd_workers) = two_deployments.items()

    first = scrape_cycle_task(shard=0, shards=2)
    assert (first["targets"], first["up"]) == (2, 2)
    assert _scraped(even) == {w.pk for w in even_workers}
    assert _scraped(odd) == set()
    # The pool aggregate of the even deployment is written (worker_id NULL); none for the odd one yet.
    assert Sample.objects.filter(deployment_id=even.pk, worker_id__isnull=True).exists()
    assert not Sample.objects.filter(deployment_id=odd.pk).exists()

    result = scrape_cycle_task(shard=1, shards=2)
    assert (result["targets"], result["up"]) == (2, 1)
    assert _scraped(odd) == {w.pk for w in odd_workers}
    stat = CycleStat.objects.get(kind=CycleKind.SCRAPE)
    assert (stat.last_targets, stat.last_targets_up) == (4, 3)  # both shards' latest passes
    assert _targets_gauge() == {"1": 3.0, "0": 1.0}


def test_one_shard_again_forgets_the_parts(two_deployments):
    scrape_cycle_task(shard=0, shards=2)
    scrape_cycle_task(shard=1, shards=2)
    result = scrape_cycle_task()
    assert (result["targets"], result["up"]) == (4, 3)
    stat = CycleStat.objects.get(kind=CycleKind.SCRAPE)
    assert (stat.last_targets, stat.last_targets_up, stat.shard_targets) == (4, 3, {})


def test_a_shard_outside_the_split_is_refused():
    with pytest.raises(ValueError, match="shard 2 of 2"):
        Shard(2, 2)
