"""The cost law past the measured fleets: per component, CPU and memory as a straight line in the number of workers,
fitted to bench/fleet/sim_fleet.py's figures, and what it gives at larger fleets.

For each metrics backend in the input (one or more sim_fleet JSON documents, sizes merged), each component's cores
(CPU seconds over the measurement window per second) and resident memory are fitted by least squares to
`a + b x workers`: `a` is what the component costs with no worker, `b` what each worker adds. The sizing rows add
up the control plane's side (web, its Celery workers, beat; Prometheus where it is the backend; PostgreSQL's
backends as the bench measured them) and the gateways, at each --at size, with the fit's own residual as its
uncertainty. The simulated hosts and the fleet's agent are the bench's stand-ins for real nodes: they are fitted and
shown, never summed into a sizing row.

A line fitted over 100..1,000 workers and read at 10,000 is an extrapolation: it holds where no part of the
control plane changes its regime (a pass that no longer fits its cycle, a table that leaves memory); the output says
which rows are extrapolated.

    python bench/fleet/cost_law.py fleet-embedded.json fleet-prometheus.json [--at 1000,10000]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit  # noqa: E402

CONTROL_SIDE = ("web", "celery_control", "celery_periodic", "beat", "prometheus", "postgresql")
GATEWAYS = ("gateways",)
RSS_NAMES = {"web": ("web",), "celery_control": ("control",), "celery_periodic": ("periodic",), "beat": ("beat",),
             "prometheus": ("prometheus",), "gateways": ("gateways",)}


def fit(points: list[tuple[float, float]]) -> dict | None:
    """Least squares `a + b x`, with the largest residual; None with fewer than two sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    intercept = mean_y - slope * mean_x
    residual = max(abs(y - (intercept + slope * x)) for x, y in points)
    return {"a": round(intercept, 5), "b_per_worker": round(slope, 7), "max_residual": round(residual, 5),
            "points": [[x, round(y, 4)] for x, y in sorted(points)]}


def at(law: dict | None, workers: float) -> float | None:
    return None if law is None else max(0.0, law["a"] + law["b_per_worker"] * workers)


def rss_of(sizes_entry: dict, component: str) -> float | None:
    by_process = sizes_entry.get("rss_mib_by_process") or {}
    names = RSS_NAMES.get(component, ())
    values = [mib for name, mib in by_process.items() if any(name.startswith(prefix) for prefix in names)]
    return sum(values) if values else None


def laws(sizes: list[dict]) -> dict:
    components = sorted({name for entry in sizes for name in entry.get("cpu_by_component", {})})
    out = {}
    for component in components:
        cores = [(e["workers"], e["cpu_by_component"][component]["cores"]) for e in sizes
                 if component in e.get("cpu_by_component", {})]
        memory = [(e["workers"], mib) for e in sizes if (mib := rss_of(e, component)) is not None]
        out[component] = {"cores": fit(cores), "rss_mib": fit(memory)}
    return out


def sizing(component_laws: dict, targets: list[int], largest: int) -> list[dict]:
    rows = []
    for workers in targets:
        control = {name: at(component_laws[name]["cores"], workers) for name in CONTROL_SIDE if name in component_laws}
        memory = {name: at(component_laws[name]["rss_mib"], workers) for name in CONTROL_SIDE
                  if name in component_laws and component_laws[name]["rss_mib"] is not None}
        gateways = {name: at(component_laws[name]["cores"], workers) for name in GATEWAYS if name in component_laws}
        rows.append({"workers": workers, "extrapolated": workers > largest,
                     "control_plane_cores": round(sum(v for v in control.values() if v is not None), 3),
                     "control_plane_cores_by_component": {k: round(v, 3) for k, v in control.items() if v is not None},
                     "control_plane_rss_mib": round(sum(v for v in memory.values() if v is not None)),
                     "gateway_cores": round(sum(v for v in gateways.values() if v is not None), 3)})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", type=Path, help="sim_fleet.py JSON documents")
    p.add_argument("--at", default="1000,10000", help="fleet sizes (workers) for the sizing rows")
    args = p.parse_args(argv)
    targets = [int(x) for x in args.at.split(",")]
    by_backend: dict[str, list[dict]] = {}
    for path in args.inputs:
        doc = json.loads(path.read_text())
        for backend, run in doc["backends"].items():
            by_backend.setdefault(backend, []).extend(run["sizes"])
    result = {}
    for backend, sizes in by_backend.items():
        component_laws = laws(sizes)
        largest = max(e["workers"] for e in sizes)
        result[backend] = {"sizes": sorted({e["workers"] for e in sizes}), "laws": component_laws,
                           "sizing": sizing(component_laws, targets, largest)}
    emit({"bench": "fleet_cost_law", "inputs": [str(p) for p in args.inputs], "backends": result})


if __name__ == "__main__":
    main()
