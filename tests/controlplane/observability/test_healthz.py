"""GET /healthz: 200 while the database answers, 503 when it does not; "degraded" (still 200) with what is wrong
when the broker does not answer or a periodic pass has not run for 5 of its intervals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.observability import healthz as health
from controlplane.observability.models import CycleStat
from controlplane.observability.telemetry import record_cycle
from tests.procs import ROOT, free_port

pytestmark = pytest.mark.django_db
LOOPS = ("reconcile", "health", "scrape", "alert_evaluation")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test its own broker check (no cached answer) and a web process that started just now."""
    monkeypatch.setattr(health, "_broker_cache", None)
    monkeypatch.setattr(health, "STARTED", time.time())


def test_it_answers_200_when_the_database_answers(anon_api):
    for kind in LOOPS:
        record_cycle(kind, 0.01)
    response = anon_api.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["database"], body["broker"]) == ("ok", "ok", "ok"), body
    assert set(body["control_loops"]) == set(LOOPS)
    assert all(loop["ran"] and not loop["stale"] and loop["age_s"] < 30 for loop in body["control_loops"].values())
    assert "problems" not in body
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_a_control_loop_that_stopped_running_makes_it_degraded_naming_the_loop(anon_api):
    for kind in LOOPS:
        record_cycle(kind, 0.01)
    CycleStat.objects.filter(kind="reconcile").update(last_at=timezone.now() - timedelta(minutes=10))
    response = anon_api.get("/healthz")
    assert response.status_code == 200  # the web process still serves the API
    body = response.json()
    assert body["status"] == "degraded"
    assert body["control_loops"]["reconcile"]["stale"] and body["control_loops"]["reconcile"]["age_s"] >= 600
    assert not body["control_loops"]["scrape"]["stale"]
    assert body["problems"] == ["no reconcile pass for 600 s (stale after 30 s)"]


def test_a_pass_that_never_ran_is_stale_only_once_the_process_has_been_up_long_enough(anon_api, monkeypatch):
    assert anon_api.get("/healthz").json()["status"] == "ok"  # just started: nothing ran yet, nothing is late
    monkeypatch.setattr(health, "STARTED", time.time() - 120)
    body = anon_api.get("/healthz").json()
    assert body["status"] == "degraded"
    assert {kind for kind, loop in body["control_loops"].items() if loop["stale"] and not loop["ran"]} == set(LOOPS)


def test_a_broker_that_refuses_connections_makes_it_degraded(anon_api, settings):
    # A real AMQP connection attempt to a port nothing listens on.
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    settings.TANDEM_BROKER_TIMEOUT_S = 1
    body = anon_api.get("/healthz").json()
    assert body["status"] == "degraded"
    assert body["broker"].startswith("error: ") and "refused" in body["broker"].lower(), body["broker"]
    assert body["problems"][0].startswith("broker error: ")


def test_a_filesystem_broker_whose_folder_is_gone_makes_it_degraded(anon_api, settings, tmp_path):
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"data_folder_in": str(tmp_path / "gone"),
                                                "data_folder_out": str(tmp_path / "gone")}
    body = anon_api.get("/healthz").json()
    assert body["broker"] == f"error: the broker folder {tmp_path / 'gone'} is not writable"


def test_it_answers_503_when_the_database_is_unreachable(tmp_path):
    # A real unreachable PostgreSQL (nothing listens on that port), in a process of its own.
    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/nothing",
           "TANDEM_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
    code = ("import django, json; django.setup(); from django.test import Client; "
            "r = Client().get('/healthz'); print(json.dumps([r.status_code, json.loads(r.content)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    status, body = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == 503
    assert body["status"] == "error" and body["database"].startswith("error")
