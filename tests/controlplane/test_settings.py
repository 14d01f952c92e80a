"""controlplane/settings.py: the environment is read in one place, bad values fail loudly, production is secure."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.lib.env import env_bool, env_int, env_list
from tests.procs import ROOT


def manage(args: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DJANGO_DEBUG", "ALLOWED_HOSTS")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**base, "TANDEM_VAR_DIR": str(tmp_path), **env})


def test_check_deploy_is_clean_with_debug_off_a_real_secret_and_hosts(tmp_path):
    out = manage(["check", "--deploy", "--fail-level", "WARNING"], tmp_path, DJANGO_DEBUG="0",
                 SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="tandem.example.com")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues (0 silenced)." in out.stdout
    assert "WARNING" not in out.stderr


def test_a_secret_key_is_required_when_debug_is_off(tmp_path):
    out = manage(["check"], tmp_path, DJANGO_DEBUG="0", ALLOWED_HOSTS="tandem.example.com")
    assert out.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY must be set in production" in out.stderr


def test_local_use_generates_one_secret_key_and_keeps_it(tmp_path):
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    first = manage(["shell", "-c", code], tmp_path)
    second = manage(["shell", "-c", code], tmp_path)
    assert first.returncode == 0, first.stderr
    key = (tmp_path / "secret_key").read_text().strip()
    assert len(key) >= 50
    assert first.stdout.strip().splitlines()[-1] == second.stdout.strip().splitlines()[-1] == key


def test_a_bad_boolean_in_the_environment_fails_at_start(tmp_path):
    out = manage(["check"], tmp_path, DJANGO_DEBUG="maybe")
    assert out.returncode != 0
    assert "DJANGO_DEBUG='maybe' is not a boolean" in out.stderr


def test_a_bad_database_url_fails_at_start(tmp_path):
    out = manage(["check"], tmp_path, DATABASE_URL="nosuchdb://x")
    assert out.returncode != 0
    assert "DATABASE_URL='nosuchdb://x' cannot be parsed" in out.stderr


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False),
                                          ("false", False), ("no", False), ("off", False), ("", False)])
def test_env_bool_reads_the_usual_spellings(raw, expected):
    assert env_bool("X", not expected, environ={"X": raw}) is expected
    assert env_bool("X", expected, environ={}) is expected


def test_env_bool_raises_on_anything_else():
    with pytest.raises(ImproperlyConfigured, match="X='2' is not a boolean"):
        env_bool("X", False, environ={"X": "2"})


def test_env_int_raises_on_a_non_integer_and_out_of_range():
    assert env_int("P", 8000, environ={"P": " 9000 "}) == 9000
    assert env_int("P", 8000, environ={}) == 8000
    with pytest.raises(ImproperlyConfigured, match="P='80x' is not an integer"):
        env_int("P", 8000, environ={"P": "80x"})
    with pytest.raises(ImproperlyConfigured, match="P=70000 is above its maximum 65535"):
        env_int("P", 8000, maximum=65535, environ={"P": "70000"})
    with pytest.raises(ImproperlyConfigured, match="P=0 is below its minimum 1"):
        env_int("P", 8000, minimum=1, environ={"P": "0"})


def test_env_list_splits_on_commas():
    assert env_list("H", ["d"], environ={"H": "a.example.com, b.example.com,,"}) == ["a.example.com",
                                                                                    "b.example.com"]
    assert env_list("H", ["d"], environ={}) == ["d"]


def test_the_embedded_sqlite_database_waits_instead_of_failing_when_locked(settings):
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.sqlite3":
        pytest.skip("only for the embedded SQLite default")
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert db["OPTIONS"]["timeout"] >= 10
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]


def test_tandem_production_asks_for_what_production_needs_with_debug_off(tmp_path):
    out = manage(["check"], tmp_path, TANDEM_PRODUCTION="1", ALLOWED_HOSTS="tandem.example.com")
    assert out.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY must be set in production" in out.stderr
    code = "from django.conf import settings; print(settings.DEBUG, settings.PRODUCTION, settings.SESSION_COOKIE_SECURE)"
    out = manage(["shell", "-c", code], tmp_path, TANDEM_PRODUCTION="1", ALLOWED_HOSTS="tandem.example.com",
                 SECRET_KEY=secrets.token_urlsafe(50))
    assert out.stdout.strip().splitlines()[-1] == "False True True", out.stderr
    local = manage(["shell", "-c", code], tmp_path)  # nothing set: debug off, local conveniences on
    assert local.stdout.strip().splitlines()[-1] == "False False False", local.stderr
