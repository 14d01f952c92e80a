"""GET /healthz: 200 while the database answers, 503 when it does not."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.procs import ROOT, free_port

pytestmark = pytest.mark.django_db


def test_it_answers_200_when_the_database_answers(anon_api):
    response = anon_api.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


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
