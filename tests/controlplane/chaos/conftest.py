"""Chaos tests: `demo` opted in, with ready prefill and decode rows behind a real HTTP server standing in for the
gateway's /metrics (the observability app's scrape reads it over HTTP as it reads the real gateway, and the driver
reads what the scrape kept: chaos_pass), a decode row whose process is a real child process (the agent signals it for
real), and the agent's tasks run in this process when the services send them."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from datetime import datetime, timezone as dt_timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
import requests

from tests.controlplane.rollouts.conftest import exposition


class FakeGateway:
    """GET /metrics: `revisions` as the gateway's exposition ({1: {"ok": n, "errors": n, "ttft": s}}), plus
    `migrations` and `retries` counters."""

    def __init__(self):
        self.revisions: dict[int, dict] = {1: {"ok": 0}}
        self.migrations = 0
        self.retries = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = (exposition(owner.revisions)
                        + "# TYPE tandem_request_migrations_total counter\n"
                        + f'tandem_request_migrations_total{{reason="worker_gone"}} {owner.migrations}\n'
                        + "# TYPE tandem_gateway_retries_total counter\n"
                        + f'tandem_gateway_retries_total{{kind="upstream_error"}} {owner.retries}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default, per test).
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def serve(self, ok: int, errors: int = 0, ttft: float = 0.03):
        self.revisions = {1: {"ok": ok, "errors": errors, "ttft": ttft}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def chaos_pass(*, now: float | None = None) -> dict:
    """The observability app's scrape of the gateways, then one chaos driver pass, both at `now`: production's two
    beats in one step (the driver judges the gateway's counters as the scrape kept them). Returns the driver's pass.
    Only the gateways: the workers' rows have made-up ports, where on a shared machine another process may listen
    and hold the scrape to its timeout."""
    from controlplane.chaos.driver import drive_chaos
    from controlplane.observability.store import scrape_cycle, scrape_targets

    now = time.time() if now is None else now
    scrape_cycle(targets=[target for target in scrape_targets() if target.role == "gateway"], now=now)
    return drive_chaos(now=now)


@pytest.fixture
def gateway():
    server = FakeGateway()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def no_pause_outlives_its_test():
    """Run ids start again in each test's rolled-back database: a pause one test left must not make the next
    test's fault of the same key a duplicate."""
    from controlplane.agent import fault_holds, processes
    from controlplane.agent.fault_kinds import KINDS

    yield
    with fault_holds.held_lock:
        left = list(fault_holds.held.items())
        fault_holds.held.clear()
    for key, pause in left:
        pause.timer.cancel()
        if pause.state is not None and pause.handle is None:  # a freeze, a fill file
            KINDS[pause.kind].stop(key=key, worker_id=pause.worker_id, state=pause.state)
            continue
        processes.signal_group(pause.handle, signal.SIGCONT if pause.state is None else signal.SIGKILL)


@pytest.fixture
def child_processes():
    """spawn(marker) → a real child process (sleep) in its own session; all killed afterwards."""
    from controlplane.agent import processes

    handles = []

    def spawn(marker: str, tmp_dir):
        handle = processes.spawn([sys.executable, "-c", "import time; time.sleep(300)"],
                                 log_path=tmp_dir / f"child-{marker}.log", marker=marker)
        handles.append(handle)
        return handle

    yield spawn
    for handle in handles:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            processes.signal_group(handle, sig)
        processes.wait_exit(handle, 10)


def process_state(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def wait_until(what: str, condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def world(deployment, online_node, make_worker, gateway, admin, child_processes, tmp_path):
    """`demo` opted in: a ready prefill row, a ready decode row whose process is a real child, a ready gateway row
    whose /metrics is `gateway`."""
    from controlplane.chaos.services import chaos_enable
    from controlplane.models import Worker, WorkerRole

    make_worker(deployment, "prefill")
    decode = make_worker(deployment, "decode")
    handle = child_processes(str(decode.id), tmp_path)
    Worker.objects.filter(pk=decode.pk).update(
        pid=handle.pid, started_at=datetime.fromtimestamp(handle.create_time, tz=dt_timezone.utc))
    make_worker(deployment, WorkerRole.GATEWAY, port=gateway.port)
    chaos_enable(deployment=deployment, enabled=True, actor=admin)
    decode.refresh_from_db()
    return {"deployment": deployment, "decode": decode, "handle": handle}


@pytest.fixture
def agent_inline(monkeypatch):
    """The agent's fault tasks, when a service sends them (after commit), run here and now as the node's agent
    would run them; every message is recorded as (task, args, queue)."""
    from controlplane.agent import tasks as agent_tasks
    from controlplane.celery import app

    # task_send publishes from a thread of its own (a broker timeout) unless eager: here, in this thread, which
    # sees the test's uncommitted rows.
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    messages: list[tuple[str, tuple, str | None]] = []
    for name in ("agent_fault_inject", "agent_fault_revert"):
        task = getattr(agent_tasks, name)

        def apply_async(args=(), kwargs=None, queue=None, _name=name, _task=task, **options):
            messages.append((_name, tuple(args), queue))
            _task.run(*args)

        monkeypatch.setattr(task, "apply_async", apply_async)
    yield messages
    app.conf.task_always_eager = previous


@pytest.fixture
def experiment(world, admin):
    """pause the decode worker for 5 s; hypothesis: error ratio <= 0.05 over 5 s, TTFT P99 <= 2x before, a ready
    decode worker; abort on error ratio > 0.5 over 5 s held for 4 s."""
    from controlplane.chaos.services import experiment_create

    return experiment_create(
        deployment=world["deployment"], actor=admin, name="pause-decode", target={"role": "decode", "count": 1},
        faults=[{"kind": "pause"}], duration_s=5,
        hypothesis=[{"metric": "error_ratio", "max": 0.05, "window_s": 5},
                    {"metric": "ttft_p99_seconds", "max_baseline_ratio": 2, "window_s": 5},
                    {"metric": "ready_workers", "role": "decode", "min": 1}],
        abort_conditions=[{"metric": "error_ratio", "above": 0.5, "window_s": 5, "for_s": 4}],
        recovery_timeout_s=30)


def fault_leftovers(*, keys, ports: dict[int, int]) -> list[str]:
    """What the faults of `keys` left behind, one sentence each (empty: nothing): a worker process still stopped (a
    pause never released), a fault proxy or hog still running (found by its marker, whatever its pid), a Worker row
    whose port is not the one it had before (`ports`: worker id → port) or whose KV address still names a proxy, a
    disk_fill's file still there."""
    from controlplane.agent import processes, proxy_faults, resource_faults
    from controlplane.models import Worker

    markers = {proxy_faults.marker_of(key) for key in keys} | {resource_faults.marker_of(key) for key in keys}
    left = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            marker = proc.environ().get(processes.MARKER_ENV)
        except (psutil.Error, OSError):
            continue
        if marker in markers:
            left.append(f"process {proc.pid} ({marker}) still runs")
    left += [f"the fill file {path} is still there" for key in keys
             if (path := resource_faults.fill_path(key)).exists()]
    for worker in Worker.objects.filter(pk__in=ports):
        if worker.port != ports[worker.pk]:
            left.append(f"worker {worker.pk}'s row names port {worker.port}, not its own {ports[worker.pk]}")
        if worker.kv_port is not None:
            left.append(f"worker {worker.pk}'s KV pushes still go to port {worker.kv_port}")
        if worker.pid and process_state(worker.pid) == psutil.STATUS_STOPPED:
            left.append(f"worker {worker.pk}'s process {worker.pid} is still stopped")
    return left


@contextlib.contextmanager
def simulated_worker_for(row, role: str, log_path):
    """`row` (a Worker) served by a real simulated worker of `role` started here: the row gets its pid, port and start
    time, as the agent would write them; stopped at the end."""
    from controlplane.agent import processes
    from controlplane.models import Worker
    from tests.procs import free_port

    port = free_port()
    handle = processes.spawn([sys.executable, "-m", "inference.worker", "--simulate", "tiny-cpu", "--role", role,
                              "--model", "/m/sim", "--port", str(port)], log_path=log_path, marker=str(row.pk))
    try:
        Worker.objects.filter(pk=row.pk).update(
            pid=handle.pid, port=port, started_at=datetime.fromtimestamp(handle.create_time, tz=dt_timezone.utc))

        def answers() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until("the simulated worker to answer", answers, timeout=60)
        row.refresh_from_db()
        yield row
    finally:
        processes.stop(handle, deadline_s=5)
