"""The proxy faults: the node agent starts a fault proxy (controlplane.agent.fault_proxy) in front of a worker and
points the worker's row at it; the revert points the row back and stops the proxy.

- `error`, `latency`, `reset`, `partition` move the row's `port`, so that the gateway's membership (and the health
  checks, which the proxy passes through, except under a partition) reach the worker through the proxy.
- `kv_latency`, `kv_reset`, `kv_corrupt` move the row's `kv_port` (a decode worker's only), its KV address: the
  membership hands it to the gateway as `kv_urls`, the gateway hands it to the prefill worker as the place to push
  the KV, and nothing else reaches the proxy. The gateway's own requests, streams and probes, the health checks and
  the scraper still reach the worker directly, so only the prefill → decode push is faulted.

The row is moved with conditional UPDATEs on the port read: a worker restarted meanwhile (a new port) is left where
it is, and the fault is over for it. The proxy carries the fault's deadline and stops faulting at it by itself; the
agent's timer (controlplane.agent.faults) reverts the row then too. What a later revert needs (the proxy's pid and
create time, both ports) is on the injected Action row's result, so that an agent restarted meanwhile can undo it.
"""
from __future__ import annotations

import logging
import signal
import socket
import time
from pathlib import Path

from django.conf import settings

from controlplane.agent import processes
from controlplane.models import Worker, WorkerRole

log = logging.getLogger(__name__)

PROXY_MODULE = "controlplane.agent.fault_proxy"
LISTEN_TIMEOUT_S = 15.0


class ProxyFailed(Exception):
    pass


def marker_of(key: str) -> str:
    return f"fault-proxy:{key}"


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def proxy_start(*, key: str, kind, worker: Worker, until: float,
                params: dict) -> tuple[dict, processes.ProcessHandle]:
    """Start the proxy in front of the worker and point the row at it (its `port`, or its `kv_port` for a KV
    fault); `kind` the fault's declaration (fault_kinds.FaultKind: its proxy flags, whether it is on the KV push).
    Returns what a revert needs and the proxy's process; raises ProxyFailed (the proxy stopped again) when the
    worker cannot take the fault, the proxy does not listen in time, or the worker moved meanwhile."""
    upstream_port, host = worker.port, worker.host
    on_kv = kind.on_kv
    if on_kv and worker.role != WorkerRole.DECODE:
        raise ProxyFailed(f"a {kind.name} fault is on the KV push to a decode worker; worker {worker.id} is "
                          f"{worker.role}")
    if on_kv and worker.kv_port is not None:
        raise ProxyFailed(f"worker {worker.id}'s KV pushes already go through port {worker.kv_port}")
    port = processes.free_port(host)
    argv = processes.python_argv(PROXY_MODULE, "--upstream", f"http://{host}:{upstream_port}", "--host", host,
                                 "--port", str(port), "--until", f"{until:.3f}", *kind.proxy_flags(params))
    log_path = Path(settings.TANDEM_LOG_DIR) / f"fault-proxy-worker-{worker.id}.log"
    handle = processes.spawn(argv, log_path=log_path, marker=marker_of(key), cwd=Path(settings.BASE_DIR))
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while not _listening(host, port):
        if not processes.is_alive(handle) or time.monotonic() > deadline:
            processes.signal_group(handle, signal.SIGKILL)
            raise ProxyFailed(f"the fault proxy did not listen on port {port}: "
                              f"{processes.log_tail(log_path, num_lines=5)}")
        time.sleep(0.05)
    moved = (Worker.objects.filter(pk=worker.pk, port=upstream_port, kv_port__isnull=True).update(kv_port=port)
             if on_kv else Worker.objects.filter(pk=worker.pk, port=upstream_port).update(port=port))
    if not moved:
        processes.signal_group(handle, signal.SIGKILL)
        raise ProxyFailed("the worker moved (restarted on another port) while the proxy started")
    log.info("fault %s: worker %s reached through the fault proxy on port %d (pid %d)%s", key, worker.id, port,
             handle.pid, " by KV pushes" if on_kv else "")
    return {"proxy_pid": handle.pid, "proxy_started": handle.create_time, "proxy_port": port,
            "upstream_port": upstream_port, **({"kv": True} if on_kv else {})}, handle


def proxy_stop(*, key: str, worker_id: int, state: dict) -> str:
    """Point the row back at the worker (unless it moved since; a KV fault: no KV address again) and SIGTERM the
    proxy, which drains and exits. Returns "restored", or "gone" when neither the row nor the proxy needed
    anything (or no proxy was started: a failed inject's row)."""
    if "proxy_port" not in state:
        return "gone"
    if state.get("kv"):
        moved_back = Worker.objects.filter(pk=worker_id, kv_port=state["proxy_port"]).update(kv_port=None)
    else:
        moved_back = Worker.objects.filter(pk=worker_id, port=state["proxy_port"]).update(port=state["upstream_port"])
    handle = processes.ProcessHandle(pid=state["proxy_pid"], create_time=state["proxy_started"],
                                     marker=marker_of(key))
    stopped = processes.signal_group(handle, signal.SIGTERM)
    return "restored" if moved_back or stopped else "gone"
