"""A stand-in for `python -m inference.worker` that writes its log as the worker does, for the tests of what a
restart reason quotes: `logging.basicConfig` with the worker's format ("%(asctime)s decode[%(process)d] LEVEL name:
message"), a few threads as torch keeps, and /health on its port.

Each start runs the steps of `next_steps(...)`, in order:
    "info:<text>", "warning:<text>", "error:<text>"   a log record of that level
    "print:<text>"                                     a line without a level (a library's print)
    "raise:<text>"                                     RuntimeError(text) uncaught: a traceback, exit code 1
    "exit:<code>"                                      sys.exit(code)
and then serves /health until it is killed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

SCRIPT = r'''
import http.server, logging, sys, threading, time

port, steps = int(sys.argv[1]), sys.argv[2:]
logging.basicConfig(level=logging.INFO,
                    format="%(asctime)s decode[%(process)d] %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("inference.worker.server")
for _ in range(4):  # the engine's threads: a SIGKILL ends them a moment after the main thread
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
for step in steps:
    kind, _, text = step.partition(":")
    if kind in ("info", "warning", "error"):
        getattr(log, kind)(text)
    elif kind == "print":
        print(text, flush=True)
    elif kind == "raise":
        raise RuntimeError(text)
    elif kind == "exit":
        sys.exit(int(text))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args): pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


class LoggingWorker:
    """What the agent runs for a worker in these tests: the steps set last, for every start from then on."""

    def __init__(self) -> None:
        self.steps: list[str] = ["info:ready"]

    def next_steps(self, *steps: str) -> None:
        self.steps = list(steps)

    def argv(self, worker, port: int) -> list[str]:
        return [sys.executable, "-c", SCRIPT, str(port), *self.steps]


def use_logging_worker(monkeypatch, settings, tmp_path) -> LoggingWorker:
    """Make the agent start LoggingWorker's script for every worker; logs go under tmp_path."""
    from controlplane.agent import launch

    settings.TANDEM_LOG_DIR = tmp_path / "logs"
    stand_in = LoggingWorker()
    monkeypatch.setattr(launch, "argv_for", stand_in.argv)
    return stand_in


def wait_for_log(log_path: str | Path, text: str, timeout_s: float = 30.0) -> None:
    """Until a line the process wrote has `text` (the `--- starting:` lines name the steps): a kill before the
    process wrote its lines would test nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lines = Path(log_path).read_text(errors="replace").splitlines()
            if any(text in line for line in lines if not line.startswith("--- ")):
                return
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in {log_path}")
        time.sleep(0.05)


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s:g} s")
        time.sleep(0.05)
