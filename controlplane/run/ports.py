"""The ports `make run` serves on: free or not, and if not, who holds them, said before anything starts.

A server that cannot bind its port exits at once and is restarted with backoff; for the demo gateway that ends in a
`failed` worker minutes later, with nothing on the terminal. Checking first turns that into one line that names the
port, the setting that chose it and the process that holds it. Pure Python (no Django).
"""
from __future__ import annotations

import socket
from collections.abc import Iterable

import psutil


class PortBusy(Exception):
    """A port make run needs is taken; the message says by what and what to do."""


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now. SO_REUSEADDR as runserver and aiohttp set it, so that the
    TIME_WAIT connections a previous run left behind do not count as "in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_holders(port: int) -> list[int | None]:
    """The pids listening on `port` (None for a socket whose process this user may not see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return [None]
    pids = {conn.pid for conn in connections
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port}
    return sorted(pids, key=lambda pid: (pid is None, pid or 0)) or [None]


def describe_process(pid: int | None) -> str:
    """'pid 4242 (python3 -m http.server 8001)', or what is known when the process cannot be read."""
    if pid is None:
        return "a process this user cannot see (another user's, or outside this machine's process table)"
    try:
        process = psutil.Process(pid)
        command = " ".join(process.cmdline()) or process.name()
    except psutil.NoSuchProcess:
        return f"pid {pid} (exited since)"
    except psutil.AccessDenied:
        return f"pid {pid} (another user's process)"
    if len(command) > 120:
        command = command[:117] + "..."
    return f"pid {pid} ({command})"


def port_check(port: int, *, what: str, setting: str, own_pids: Iterable[int] = (),
               avoid: Iterable[int] = ()) -> None:
    """Raise PortBusy unless `port` is free or held only by one of `own_pids` (the demo's own gateway, left
    running by a previous run that was killed: the agent adopts it again)."""
    if port_free(port):
        return
    holders = port_holders(port)
    own = set(own_pids)
    if own and all(pid in own for pid in holders):
        return
    held_by = "; ".join(describe_process(pid) for pid in holders if pid not in own)
    raise PortBusy(f"port {port} ({what}, {setting}) is in use by {held_by}. Stop it, or set {setting} to a free "
                   f"port, e.g. {setting}={_free_near(port, set(avoid))}")


def _free_near(port: int, avoid: set[int]) -> int:
    for candidate in range(port + 1, min(port + 200, 65536)):
        if candidate not in avoid and port_free(candidate):
            return candidate
    return port + 1
