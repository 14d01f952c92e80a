"""The node agent measures its host's roofline (matmul peak per precision, read bandwidth) and stores it on its Node.

The measurement (`inference.roofline_measure`, torch) runs as a child process with a timeout: the agent itself never
imports torch, so it stays a small process, and a measurement that hangs costs nothing but its timeout. It runs in
a background thread when the agent starts (TANDEM_HOST_MEASURE) and again on demand (the agent task
`agent_measure_host`, which `POST /api/v1/nodes/<name>/measure` sends through controlplane.services.nodes). Workers
started before it ends start without host figures and report no efficiency until their next start.

A simulated fleet runs no torch benchmark: its nodes carry SIMULATED_ROOFLINE, marked `"source": "simulated"`.
"""
from __future__ import annotations

import json
import logging
import subprocess
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from controlplane.agent import processes, runtime
from controlplane.models import Node
from controlplane.services.nodes import node_roofline_set

log = logging.getLogger(__name__)

MEASURE_MODULE = "inference.roofline_measure"
# A plausible small CPU host (one core of an AVX2 laptop), so that pages and alerts have figures to show.
SIMULATED_ROOFLINE = {"source": "simulated", "device": "cpu", "cpu_count": 4,
                      "one_thread": {"threads": 1, "matmul_gflops": {"float32": 60.0, "int8": 120.0}, "read_gbs": 12.0},
                      "all_cores": {"threads": 4, "matmul_gflops": {"float32": 220.0, "int8": 440.0},
                                    "read_gbs": 25.0}}


class MeasureError(RuntimeError):
    """The measurement process failed, timed out or printed no JSON."""


def roofline_measure() -> dict:
    """This host's roofline, from a child process (MeasureError if it fails)."""
    argv = processes.python_argv(MEASURE_MODULE)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=settings.BASE_DIR,
                              timeout=settings.TANDEM_HOST_MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"{MEASURE_MODULE} took over {settings.TANDEM_HOST_MEASURE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise MeasureError(f"{MEASURE_MODULE} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise MeasureError(f"{MEASURE_MODULE} printed no JSON: {done.stdout[-300:]!r}") from None


def host_measure(*, node_name: str) -> str:
    """Measure (or, in a simulated fleet, take SIMULATED_ROOFLINE) and store it on the node: "measured",
    "simulated", "failed" (logged; the node keeps its previous figures) or "gone"."""
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        return "gone"
    if runtime.simulated:
        node_roofline_set(node=node, roofline={**SIMULATED_ROOFLINE, "measured_at": timezone.now().isoformat()})
        return "simulated"
    try:
        roofline = roofline_measure()
    except MeasureError as exc:
        log.warning("node %s: measuring the host failed: %s", node_name, exc)
        return "failed"
    node_roofline_set(node=node, roofline={**roofline, "measured_at": timezone.now().isoformat()})
    log.info("node %s: roofline measured in %s s: one thread %s, all cores %s", node_name, roofline.get("seconds"),
             roofline.get("one_thread"), roofline.get("all_cores"))
    return "measured"


def in_background(name: str, work: Callable[[], object], *, failed: str) -> threading.Thread:
    """Run `work` in a daemon thread of its own (a look at the host at the agent's start, which must not hold the
    start up); an exception is logged as `failed`, and the thread's database connection closed."""
    def run() -> None:
        try:
            work()
        except Exception:
            log.exception(failed)
        finally:
            close_old_connections()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def host_measure_in_background(*, node_name: str) -> threading.Thread:
    return in_background(f"measure-{node_name}", lambda: host_measure(node_name=node_name),
                         failed=f"measuring the host of node {node_name} failed")
