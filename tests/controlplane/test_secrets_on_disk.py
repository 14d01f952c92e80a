"""Secrets stay private: var/ is 0700 and the SQLite database 0600 (a fresh `manage.py migrate` in a new folder),
the debug page is off unless asked for (a request with a wrong Host header gets no technical page), and when on it
masks passwords inside URL settings (DATABASE_URL, CELERY_BROKER_URL) and the key of a DSN-style URL (KEY@host)."""
from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from urllib.parse import urlsplit

from django.test import RequestFactory
from django.views.debug import technical_500_response

from controlplane.lib.reporting import mask_url_password
from tests.conftest import ROOT


def test_a_fresh_var_folder_is_0700_and_its_database_0600(tmp_path):
    var = tmp_path / "var"
    env = {**os.environ, "TANDEM_VAR_DIR": str(var), "DJANGO_DEBUG": "1"}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300)
    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    for name in ("tandem.sqlite3", "secret_key"):
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name


def test_an_existing_open_var_folder_is_closed(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    env = {**os.environ, "TANDEM_VAR_DIR": str(var), "DJANGO_DEBUG": "1"}
    subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    assert stat.S_IMODE(var.stat().st_mode) == 0o700


def test_url_passwords_are_masked():
    assert mask_url_password("postgres://tandem:s3cret@db:5432/tandem") == \
        "postgres://tandem:********************@db:5432/tandem"
    assert mask_url_password("redis://:hunter2@127.0.0.1:6379/0") == "redis://:********************@127.0.0.1:6379/0"
    assert mask_url_password("filesystem://") == "filesystem://"
    # A DSN whose user part is the key, under a setting name nothing would call secret.
    assert mask_url_password("https://0123abcd4567@sentry.example.com/42") == \
        "https://********************@sentry.example.com/42"


def test_by_default_a_bad_request_gets_no_debug_page(tmp_path):
    """No DJANGO_DEBUG in the environment: an anonymous request with a wrong Host header (Django's DisallowedHost)
    gets a plain 400, not the technical page with the process's settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_DEBUG", "TANDEM_PRODUCTION", "SECRET_KEY")}
    env.update(TANDEM_VAR_DIR=str(tmp_path / "var"), DJANGO_SETTINGS_MODULE="controlplane.settings",
               SENTRY_DSN=f"https://{secrets.token_hex(8)}@sentry.example.com/1")
    code = ("import django; django.setup(); from django.conf import settings; from django.test import Client; "
            "r = Client().get('/api/v1/deployments/', HTTP_HOST='evil.example'); "
            "print(settings.DEBUG, r.status_code); print(r.content.decode(errors='replace'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, body = out.stdout.split("\n", 1)
    assert first == "False 400", out.stdout[:500]
    assert "DisallowedHost" not in body and "SENTRY_DSN" not in body and "Traceback" not in body


def test_the_debug_page_shows_no_broker_or_database_password(settings):
    # Made at run time and kept in no local variable: the page also shows this frame's source lines and locals.
    settings.DEBUG = True
    settings.DATABASE_URL = f"postgres://tandem:{secrets.token_hex(8)}@db:5432/tandem"
    settings.CELERY_BROKER_URL = f"amqp://guest:{secrets.token_hex(8)}@rabbit:5672//"
    request = RequestFactory().get("/boom")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        response = technical_500_response(request, *sys.exc_info())
    html = response.content.decode()
    assert "DATABASE_URL" in html and "CELERY_BROKER_URL" in html
    for url in (settings.DATABASE_URL, settings.CELERY_BROKER_URL):
        assert urlsplit(url).password not in html
