"""The rest of a big fleet around bench/controlplane/dashboard_page's one seeded deployment, and a loaded machine.

`create_other_deployments` makes deployments of N workers each (half prefill, half decode, plus a gateway) as rows,
as bench/fleet/sim_fleet.py's simulated fleet leaves them: 49 deployments x 20 workers beside the seeded one is its
1,000-worker size. `seed_other_samples` writes the raw 5-second samples those workers and pools leave over the last
minutes (PostgreSQL: COPY, millions of rows in seconds; elsewhere bulk_create). A full 6 h of raw retention for
1,000 workers would be ~150 M rows: more than this bench can write in minutes, and every read of the deployment
page is an index range scan scoped to one deployment, so the other deployments' rows weigh on it through the
index depth (logarithmic) and through any read that is not scoped, which is what the minutes here are enough to
show.

`CpuLoad` runs busy processes while the page is timed: the fleet's Celery processes kept a 2-core machine at a load
average of ~17 when the page was measured under it.
"""
from __future__ import annotations

import io
import multiprocessing
import time

STEP_S = 5.0


def create_other_deployments(*, num_deployments: int, workers_per_deployment: int, admin, model_path: str,
                             gpu: bool) -> list:
    """[(deployment, [workers incl. gateway])] of `num_deployments` deployments named fleet-<i>, each on its own
    node."""
    from django.utils import timezone

    from controlplane.models import Node, Pool, Worker
    from controlplane.services import deployment_create

    now = timezone.now()
    half = workers_per_deployment // 2
    out = []
    for index in range(num_deployments):
        gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 2**30}
                for i in range(8)] if gpu else []
        node = Node.objects.create(name=f"fleet-{index}", hostname=f"fleet-{index}", gpus=gpus, last_seen_at=now)
        deployment = deployment_create(
            name=f"fleet-{index}", mode="disaggregated", model_path=model_path, actor=admin,
            replicas={"prefill": half, "decode": workers_per_deployment - half},
            max_replicas={"prefill": 32, "decode": 32}).deployment
        pools = {pool.role: pool for pool in Pool.objects.filter(deployment=deployment)}
        rows = []
        for w in range(workers_per_deployment):
            role = "prefill" if w < half else "decode"
            rows.append(Worker(deployment=deployment, pool=pools[role], role=role,
                               revision=deployment.current_revision, node=node,
                               gpu_index=w % 8 if gpu else None, status="ready", port=43000 + w,
                               pid=60000 + index * 100 + w, started_at=now, ready_at=now))
        rows.append(Worker(deployment=deployment, role="gateway", node=node, status="ready", port=43999,
                           pid=60000 + index * 100 + 99, started_at=now, ready_at=now))
        out.append((deployment, Worker.objects.bulk_create(rows)))
    return out


def seed_other_samples(fleet: list, *, now: float, minutes: float, value_at) -> dict:
    """Raw samples of every metric, every worker and every pool aggregate of `fleet`, one per 5 s over the last
    `minutes`, valued by value_at(metric id, series index, ts); returns {"num_fleet_samples", "seed_fleet_s"}."""
    from django.db import connection

    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Sample

    started = time.perf_counter()
    series = []
    for deployment, workers in fleet:
        series += [(deployment.pk, w.role, w.pk) for w in workers]
        series += [(deployment.pk, role, None) for role in ("prefill", "decode", "gateway")]
    metric_ids = list(METRIC_IDS.values())
    num = 0
    ts = now - minutes * 60
    table = Sample._meta.db_table
    while ts <= now:
        if connection.vendor == "postgresql":
            buf = io.StringIO()
            for index, (dep, role, wid) in enumerate(series):
                for metric_id in metric_ids:
                    buf.write(f"{ts}\t{dep}\t{role}\t{wid if wid is not None else chr(92) + 'N'}\t{metric_id}\t"
                              f"{value_at(metric_id, index, ts)}\n")
            with connection.cursor() as cursor, cursor.copy(
                    f"COPY {table} (ts, deployment_id, role, worker_id, metric, value) FROM STDIN") as copy:
                copy.write(buf.getvalue())
        else:
            Sample.objects.bulk_create(
                [Sample(ts=ts, deployment_id=dep, role=role, worker_id=wid, metric=metric_id,
                        value=value_at(metric_id, index, ts))
                 for index, (dep, role, wid) in enumerate(series) for metric_id in metric_ids], batch_size=5000)
        num += len(series) * len(metric_ids)
        ts += STEP_S
    return {"num_fleet_series": len(series) * len(metric_ids), "num_fleet_samples": num,
            "seed_fleet_s": round(time.perf_counter() - started, 1)}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


class CpuLoad:
    """`with CpuLoad(n):` n busy processes (none when n is 0)."""

    def __init__(self, num_processes: int):
        self.num_processes = num_processes
        self._stop = None
        self._procs: list = []

    def __enter__(self) -> "CpuLoad":
        if self.num_processes:
            ctx = multiprocessing.get_context("spawn")
            self._stop = ctx.Event()
            self._procs = [ctx.Process(target=_spin, args=(self._stop,), daemon=True)
                           for _ in range(self.num_processes)]
            for proc in self._procs:
                proc.start()
            time.sleep(1.0)  # let them start before the timing does
        return self

    def __exit__(self, *exc) -> None:
        if self._stop is not None:
            self._stop.set()
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
