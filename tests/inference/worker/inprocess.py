"""A real worker in the test process: `inference.worker.server.WorkerServer` on a thread and event loop of its own,
serving HTTP on a free port, around the real engine (the tiny model) wrapped in a test double.

The double is how a test breaks the engine from outside: it makes the next steps raise (a failed CUDA kernel),
hangs them (a stuck engine), or makes the engine loop's next tick raise (the loop thread dies); and the model load
waits until the test lets it go (a model that is slow to load). The worker's code carries no switch for any of it:
the double replaces the engine the worker's loop builds, as a test of a library replaces a dependency.
"""
from __future__ import annotations

import asyncio
import threading
import time

import requests

from inference.worker.config import parse_args
from inference.worker.server import WorkerServer
from tests.procs import free_port

LOAD_TIMEOUT_S = 180.0


class EngineDouble:
    """The real LLMEngine, to which everything is delegated, except what the test sets:

    - `fail_steps = N`: the next N steps raise (MAX_CONSECUTIVE_STEP_FAILURES in a row end the loop), after
      `steps_before_failing` more that do not;
    - `running.clear()`: steps block until `running.set()` (the loop stops ticking);
    - `dead = True`: the loop's next tick raises outside a step, so the engine loop thread dies."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.fail_steps = 0
        self.steps_before_failing = 0
        self.dead = False
        self.running = threading.Event()
        self.running.set()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def has_unfinished(self) -> bool:
        if self.dead:
            raise RuntimeError("the engine's state is corrupt (test double)")
        return self._engine.has_unfinished()

    def step(self, between=None):
        self.running.wait()
        if self.fail_steps and self.steps_before_failing:
            self.steps_before_failing -= 1
        elif self.fail_steps:
            self.fail_steps -= 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered (test double)")
        return self._engine.step(between)


class InProcessWorker:
    """`argv`: the worker's flags besides --port. The model load waits for `loading` (set unless `hold_load`)."""

    def __init__(self, *argv: str, hold_load: bool = False) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = WorkerServer(parse_args([*argv, "--port", str(port)]), process_metrics=False)
        self.loading = threading.Event()
        if not hold_load:
            self.loading.set()
        self.engine: EngineDouble | None = None  # once the model has loaded
        load_real = self.server.engine.loop.make_engine
        self.server.engine.loop.make_engine = lambda: self._load(load_real)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="in-process-worker", daemon=True)

    def _load(self, load_real) -> EngineDouble:
        self.loading.wait()
        self.engine = EngineDouble(load_real())
        return self.engine

    def start(self) -> InProcessWorker:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(shutdown_timeout=1.0), self._loop).result(30)
        return self

    def wait_ready(self, timeout: float = LOAD_TIMEOUT_S) -> None:
        """Let the model load, and wait until /health says ok."""
        self.loading.set()
        deadline = time.monotonic() + timeout
        while requests.get(self.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, f"the in-process worker was not ready after {timeout}s"
            time.sleep(0.05)

    def stop(self) -> None:
        self.loading.set()
        if self.engine is not None:
            self.engine.running.set()
        asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def wait_for_status(url: str, status: str, timeout: float = 30.0) -> dict:
    """/health's body once its status is `status`."""
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        try:
            body = requests.get(f"{url}/health", timeout=10).json()
        except requests.ConnectionError:
            body = None
        if body and body["status"] == status:
            return body
        time.sleep(0.05)
    raise AssertionError(f"/health never said {status!r} (last: {body})")
