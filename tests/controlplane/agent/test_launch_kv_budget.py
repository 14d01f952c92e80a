"""The node agent hands each CPU worker its share of the host's KV memory: TANDEM_KV_HOST_PERCENT of the RAM divided
among the model workers placed on the node, so that N workers never each take the same fraction of it."""
from __future__ import annotations

import psutil

from controlplane.agent import launch
from controlplane.models import Revision, Worker
from inference.worker.config import parse_args


def _engine(worker: Worker):
    argv = launch.argv_for(worker, 1234)
    return parse_args(argv[argv.index("inference.worker") + 1:]).engine


def _revision(deployment, engine_settings) -> Revision:
    return Revision.objects.create(deployment=deployment, number=deployment.revisions.count() + 1,
                                   model_path=deployment.current_revision.model_path,
                                   engine_settings=engine_settings)


def test_workers_on_one_host_divide_its_kv_budget_among_them(deployment, online_node, make_worker, settings):
    settings.TANDEM_KV_HOST_PERCENT = 40
    host_budget = psutil.virtual_memory().total * 40 // 100
    prefill = make_worker(deployment, "prefill", status="ready", node=online_node)
    assert _engine(prefill).kv_memory_budget == host_budget  # alone on the node (its gateway does not count)
    make_worker(deployment, "gateway", status="ready", node=online_node)
    decodes = [make_worker(deployment, "decode", status=status, node=online_node)
               for status in ("pending", "starting", "draining")]
    make_worker(deployment, "decode", status="stopped", node=online_node)  # holds no process: does not count
    budgets = [_engine(worker).kv_memory_budget for worker in [prefill, *decodes]]
    assert budgets == [host_budget // 4] * 4
    assert sum(budgets) <= host_budget


def test_a_revision_that_sizes_its_pool_itself_gets_no_budget(deployment, online_node, make_worker):
    for engine_settings in ({"kv_cache_bytes": 64 << 20}, {"kv_memory_fraction": 0.5}, {"device": "cuda"}):
        worker = make_worker(deployment, "decode", revision=_revision(deployment, engine_settings), node=online_node)
        assert _engine(worker).kv_memory_budget is None, engine_settings
