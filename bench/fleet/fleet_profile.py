"""Where one pass of each periodic kind spends its time, against a running simulated fleet (bench/fleet/sim_fleet.py's
database): each pass runs once in this process under cProfile, with its wall time, its number of SQL queries and
the functions that took the most time (cumulative). Run while sim_fleet.py holds its stack up (its --duration):

    DATABASE_URL=postgres://127.0.0.1:5432/tandem_sim CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \
        python bench/fleet/fleet_profile.py [--top 25] [--kinds scrape,health,reconcile,alert_evaluation,autoscale]

The passes write what they would write in the control workers (they are idempotent), so the fleet goes on as before.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _passes():
    from controlplane.alerting.services.evaluation import evaluate_rules
    from controlplane.autoscaling.autoscaler import autoscale_all
    from controlplane.models import Deployment
    from controlplane.observability.store import scrape_cycle
    from controlplane.supervision import health, reconcile
    from controlplane.supervision.at_rest import deployments_at_rest

    def reconcile_full():
        for deployment_id in Deployment.objects.values_list("id", flat=True):
            reconcile.reconcile_deployment(deployment_id)

    def reconcile_at_rest_check():
        ids = list(Deployment.objects.values_list("id", flat=True))
        return deployments_at_rest(ids)

    return {"scrape": scrape_cycle, "health": health.check_health, "reconcile_full": reconcile_full,
            "reconcile_at_rest": reconcile_at_rest_check, "alert_evaluation": evaluate_rules,
            "autoscale": autoscale_all}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--kinds", default="scrape,health,reconcile_full,reconcile_at_rest,alert_evaluation,autoscale")
    p.add_argument("--repeat", type=int, default=2, help="passes per kind; the last is profiled")
    args = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    passes = _passes()
    out = {"load_avg": os.getloadavg()}
    for kind in args.kinds.split(","):
        fn = passes[kind]
        for _ in range(args.repeat - 1):
            fn()
        profiler = cProfile.Profile()
        with CaptureQueriesContext(connection) as queries:
            started, cpu = time.perf_counter(), time.process_time()
            profiler.enable()
            fn()
            profiler.disable()
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        sql_s = sum(float(q["time"]) for q in queries.captured_queries)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.top)
        out[kind] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "queries": len(queries),
                     "sql_wall_s": round(sql_s, 3)}
        print(f"==== {kind}: {out[kind]}", file=sys.stderr)
        print(text.getvalue(), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
