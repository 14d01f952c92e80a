"""End to end with real processes: load pushes the prefill pool's P99 TTFT past its target, the scraper (Celery beat
→ control worker) stores it, the autoscaler scales the pool up through pool_scale, and a new prefill worker becomes
ready. Its own deployment (prefill max 2) keeps the shared `it-demo` untouched and bounds the cost to one worker."""
from __future__ import annotations

import threading

import pytest
import requests

from tests.procs import free_port

pytestmark = [pytest.mark.integration, pytest.mark.backends]

NAME = "it-autoscale"


def test_load_past_the_ttft_target_scales_prefill_up_to_a_new_ready_worker(live, tiny_model_dir):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 16 << 20},
        "replicas": {"prefill": 1, "decode": 1}, "min_replicas": {"prefill": 1, "decode": 1},
        "max_replicas": {"prefill": 2, "decode": 1}, "gateway_port": gateway_port,
    })
    assert created.status_code == 202, created.text
    gateway = f"http://127.0.0.1:{gateway_port}"

    def complete():
        return requests.post(f"{gateway}/v1/completions", timeout=30, json={
            "model": NAME, "prompt": "Hello there", "max_tokens": 4, "temperature": 0})

    try:
        live.wait_for("the gateway to answer", lambda: complete().status_code == 200, timeout=150, interval=0.5)
        # A TTFT target far below what a CPU prefill takes: any served request is past it.
        put = live.api("PUT", f"deployments/{NAME}/autoscaling", json={
            "enabled": True, "pools": {"prefill": {"metric": "ttft_p99_seconds", "target": 0.0005}}})
        assert put.status_code == 200, put.text

        stop = threading.Event()

        def load():
            while not stop.is_set():
                try:
                    complete()
                except requests.RequestException:
                    pass

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            def autoscaled():
                actions = [a for a in live.actions(NAME) if a["kind"] == "scale"]
                return [a for a in actions if a["actor_type"] == "autoscaler"]

            [action] = live.wait_for("the autoscaler's scale action", autoscaled, timeout=90, interval=1)
        finally:
            stop.set()
            loader.join(35)
        assert action["actor"] == "autoscaler" and action["params"]["role"] == "prefill"
        assert (action["params"]["from"], action["params"]["to"]) == (1, 2)  # ceil(1 × ratio) bounded by max 2
        assert "ttft_p99_seconds" in action["reason"] and "vs target 0.0005" in action["reason"]

        ready = live.wait_for("two ready prefill workers", lambda: len([
            w for w in live.workers(NAME, role="prefill") if w["status"] == "ready"]) == 2, timeout=120)
        assert ready
        live.wait_for("the scale action to succeed", lambda: live.action(action["id"])["status"] == "succeeded")

        series = live.api("GET", "metrics/query", params={"metric": "ttft_p99_seconds", "deployment": NAME,
                                                          "role": "prefill", "start": action["created_at"]})
        assert series.status_code == 200, series.text
        body = live.api("GET", "metrics/query", params={"metric": "ttft_p99_seconds", "deployment": NAME,
                                                        "role": "prefill"}).json()
        [pool] = body["series"]
        assert pool["worker_id"] is None and max(v for _, v in pool["points"]) > 0.0005
        autoscaling = live.api("GET", f"deployments/{NAME}/autoscaling").json()
        assert autoscaling["pools"]["prefill"]["replicas"] == 2
    finally:
        live.api("DELETE", f"deployments/{NAME}/")
