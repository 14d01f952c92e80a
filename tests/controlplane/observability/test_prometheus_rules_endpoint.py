"""GET /api/v1/prometheus/rules.yml serves the recording rules file that `manage.py tandem_recording_rules` writes
(the configured window and interval), to a token holder only, and promtool accepts what it serves."""
from __future__ import annotations

import io
import shutil
import subprocess

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_it_serves_what_the_command_writes_for_the_configured_window_and_interval(viewer_api, settings):
    settings.TANDEM_SCRAPE_WINDOW_S, settings.TANDEM_SCRAPE_INTERVAL_S = 20, 2
    answer = viewer_api.get("/api/v1/prometheus/rules.yml")
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("application/yaml")
    written = io.StringIO()
    call_command("tandem_recording_rules", stdout=written)
    assert answer.content.decode() == written.getvalue()
    assert "    interval: 2s\n" in written.getvalue() and "[20s]" in written.getvalue()


def test_the_rules_need_a_token(anon_api):
    answer = anon_api.get("/api/v1/prometheus/rules.yml")
    assert answer.status_code == 401
    assert b"tandem_pool:" not in answer.content


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_accepts_the_served_file(viewer_api, tmp_path):
    path = tmp_path / "tandem.yml"
    path.write_bytes(viewer_api.get("/api/v1/prometheus/rules.yml").content)
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
