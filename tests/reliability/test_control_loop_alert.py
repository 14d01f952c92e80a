"""A frozen broker stops every periodic pass; the web process's /healthz probes fire the control-loop alert once per
stale loop, deliver it to a webhook from the web process (Celery cannot), write it to the audit log, and resolve it
once the broker is back. Real stack: web, Celery control worker with beat, node agent, Redis behind a proxy that
stops passing bytes; a probe every second stands in for a load balancer.

Needs Redis on 127.0.0.1:6379; skipped with a clear reason where it is missing.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest
import requests

from tests.controlplane.alerting.conftest import Receiver
from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.reliability.freezable_proxy import FreezableProxy
from tests.reliability.test_hung_broker import REDIS, _redis_database

pytestmark = pytest.mark.integration
RULE = "control-plane:control-loop-stale"


def test_a_frozen_broker_fires_the_control_loop_alert_once_per_loop_and_resolves_it(tmp_path):
    number = _redis_database()
    if number is None:
        pytest.skip("no Redis on 127.0.0.1:6379 (the test freezes a Redis broker behind a proxy)")
    proxy = FreezableProxy(REDIS)
    receiver = Receiver()
    services = IsolatedServices(tmp_path / "var",
                                environ={k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"})
    live = None
    try:
        live = live_stack_start(tmp_path / "var", services, extra_env={
            "CELERY_BROKER_URL": f"redis://127.0.0.1:{proxy.port}/{number}",
            "TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1", "TANDEM_BROKER_TIMEOUT_S": "1"})
        created = live.api("POST", "channels/", json={"name": "ops", "kind": "webhook", "url": receiver.url,
                                                       "secrets": ["a-signing-secret-0123"]})
        assert created.status_code == 201, created.text

        def probe() -> dict:
            return requests.get(f"{live.web_url}/healthz", timeout=15).json()

        def events(event: str) -> Counter:
            bodies = [json.loads(r["body"]) for r in receiver.requests]
            return Counter(b["alert"]["labels"]["loop"] for b in bodies if b["event"] == event)

        live.wait_for("every control loop to run", lambda: all(
            loop["ran"] and not loop["stale"] for loop in probe()["control_loops"].values()), timeout=120)
        proxy.freeze()
        frozen_at = time.monotonic()
        live.wait_for("the control-loop alert to reach the webhook", lambda: probe() and events("firing"),
                      timeout=150, interval=1.0)
        fired_s = time.monotonic() - frozen_at
        # Probes go on (a load balancer does not stop): every loop goes stale and fires, each once.
        live.wait_for("every loop to fire", lambda: probe() and "reconcile" in events("firing")
                      and len(events("firing")) >= 3, timeout=60, interval=1.0)
        for _ in range(8):
            probe()
            time.sleep(0.5)
        fired = events("firing")
        assert set(fired.values()) == {1}, fired
        alerts = live.api("GET", "alerts/", params={"state": "firing"}).json()["results"]
        assert sorted(a["labels"]["loop"] for a in alerts if a["labels"].get("alertname") == RULE) == sorted(fired)
        actions = live.api("GET", "actions/", params={"page_size": 500}).json()["results"]
        notified = [a for a in actions if a["kind"] == "notify" and (a["actor_type"], a["actor"]) == ("rule", RULE)]
        assert len(notified) == len(fired), notified  # the audit log says who told the channels, once per loop

        proxy.thaw()
        thawed_at = time.monotonic()
        live.wait_for("every fired loop to resolve", lambda: probe() and events("resolved") == fired,
                      timeout=150, interval=1.0)
        resolved_s = time.monotonic() - thawed_at
        for _ in range(4):
            probe()
            time.sleep(0.5)
        assert events("resolved") == fired and events("firing") == fired
        print(json.dumps({"first_firing_after_freeze_s": round(fired_s, 1), "loops_fired": sorted(fired),
                          "all_resolved_after_thaw_s": round(resolved_s, 1)}))
    finally:
        proxy.thaw()
        if live is not None:
            live_stack_stop(live)
        services.close()
        proxy.close()
        receiver.close()
