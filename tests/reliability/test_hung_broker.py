"""A hung broker (Redis behind a proxy that stops passing bytes) never hangs the API and never leaves a dead
worker down: API writes answer within 5 s and are carried out once the broker is back; a worker killed meanwhile
is restarted by its own node agent and ready again within 15 s. Real stack: web, Celery control worker with beat,
node agent, a tiny-model colocated worker.

Needs Redis on 127.0.0.1:6379 (every session and CI has it); skipped with a clear reason where it is missing.
Also runnable as a script that prints its figures as JSON: `python -m tests.reliability.test_hung_broker
--freeze-s 60`.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import free_port
from tests.reliability.freezable_proxy import FreezableProxy

pytestmark = pytest.mark.integration
REDIS = ("127.0.0.1", 6379)
NAME = "frozen"


def _redis_database() -> int | None:
    """An empty Redis database number (not 0), or None when there is no Redis here."""
    try:
        import redis

        for _ in range(20):
            number = secrets.randbelow(15) + 1
            if redis.Redis(*REDIS, db=number, socket_connect_timeout=1).dbsize() == 0:
                return number
    except Exception:
        return None
    return None


def run(var_dir: Path, model_dir: Path, *, freeze_s: float = 0.0) -> dict:
    """Freeze the broker, write through the API, kill the worker, thaw; returns the figures."""
    number = _redis_database()
    if number is None:
        pytest.skip("no Redis on 127.0.0.1:6379 (the hung-broker test freezes a Redis broker behind a proxy)")
    proxy = FreezableProxy(REDIS)
    services = IsolatedServices(var_dir, environ={k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"})
    broker_url = f"redis://127.0.0.1:{proxy.port}/{number}"
    live = None
    try:
        live = live_stack_start(var_dir, services, extra_env={"CELERY_BROKER_URL": broker_url})
        created = live.api("POST", "deployments/", json={
            "name": NAME, "mode": "colocated", "model_path": str(model_dir), "dtype": "float32",
            "engine_settings": {"threads": 1, "kv_cache_bytes": 16 << 20}, "replicas": {"colocated": 1},
            "gateway_port": free_port()})
        assert created.status_code == 202, created.text

        def one_ready():
            ready = [w for w in live.workers(NAME, role="colocated") if w["status"] == "ready"]
            return ready[0] if len(ready) == 1 else None

        victim = live.wait_for("the colocated worker", one_ready, timeout=180)
        proxy.freeze()
        frozen_at = time.monotonic()

        write_s = []
        for replicas in (2, 1, 2):
            started = time.monotonic()
            response = live.api("POST", f"deployments/{NAME}/scale", json={"role": "colocated", "replicas": replicas},
                                timeout=30)
            write_s.append(time.monotonic() - started)
            assert response.status_code == 202, response.text
        pools = {p["role"]: p for p in live.api("GET", f"deployments/{NAME}/").json()["pools"]}
        assert pools["colocated"]["desired_replicas"] == 2  # committed while the broker hangs

        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()

        def back():
            worker = live.api("GET", f"workers/{victim['id']}/").json()
            return worker if worker["status"] == "ready" and worker["pid"] != victim["pid"] else None

        # A real restart (torch import, model load) on a host that may be loaded: test_worker_killed allows 90 s.
        live.wait_for("the killed worker to be back while the broker hangs", back, timeout=150)
        back_s = time.monotonic() - killed_at
        frozen_for = time.monotonic() - frozen_at
        if freeze_s > frozen_for:
            time.sleep(freeze_s - frozen_for)  # the script's longer outage; the test does not wait for it
        proxy.thaw()
        thawed_at = time.monotonic()

        def scaled():
            ready = [w for w in live.workers(NAME, role="colocated") if w["status"] == "ready"]
            return len(ready) == 2

        live.wait_for("the scale to 2 to be carried out after the thaw", scaled, timeout=180)
        return {"broker_frozen_s": round(thawed_at - frozen_at, 1), "api_write_s": [round(s, 2) for s in write_s],
                "killed_worker_back_s": round(back_s, 1),
                "scale_done_after_thaw_s": round(time.monotonic() - thawed_at, 1)}
    finally:
        proxy.thaw()
        if live is not None:
            live_stack_stop(live)
        services.close()
        proxy.close()


def test_a_hung_broker_holds_no_write_and_no_dead_worker(tmp_path, tiny_model_dir):
    """The goals (writes within 5 s, the worker back within 15 s) are measured by the script; on a loaded CI machine
    the test asserts the behaviour with room: a write is bounded by TANDEM_BROKER_TIMEOUT_S (2 s) plus the request,
    where it used to hang for minutes, and the worker comes back at all while the broker hangs."""
    figures = run(tmp_path / "var", tiny_model_dir)
    print(json.dumps(figures))
    assert max(figures["api_write_s"]) < 15, figures
    assert figures["killed_worker_back_s"] < 150, figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freeze-s", type=float, default=60.0)
    options = parser.parse_args()
    from inference.models.tiny import prepare_tiny
    from tests.conftest import MODELS_DIR

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(Path(tmp) / "var", prepare_tiny(MODELS_DIR / "tiny"), freeze_s=options.freeze_s)))
