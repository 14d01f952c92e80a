"""Django settings for Tandem's control plane.

The one place that reads the environment (STYLE.md), with the fleet's part in settings_fleet.py: every other module
reads `django.conf.settings`.
Embedded defaults (SQLite and a filesystem broker under `var/`) make `make run` and `make test` work on a bare
machine; production sets TANDEM_PRODUCTION=1 (or DJANGO_DEBUG=0), DATABASE_URL, CELERY_BROKER_URL, SECRET_KEY and
ALLOWED_HOSTS. Django's debug pages are off unless DJANGO_DEBUG=1.
"""
from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlplane.lib.env import env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

def _secret_key(production: bool, var_dir: Path) -> str:
    """From SECRET_KEY; outside production only, generated once into var/secret_key so sessions survive restarts."""
    key = env_str("SECRET_KEY")
    if key:
        return key
    if production:
        raise ImproperlyConfigured("SECRET_KEY must be set in production (TANDEM_PRODUCTION=1 or DJANGO_DEBUG=0)")
    path = var_dir / "secret_key"
    if not path.exists():
        # Written whole under a name of its own, then linked into place: of two processes starting at once, one key
        # wins and neither reads a file the other has created but not yet written.
        own = path.with_name(f".secret_key.{os.getpid()}")
        with os.fdopen(os.open(own, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(own, path)
        except FileExistsError:
            pass
        finally:
            own.unlink()
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it to generate a new key")
    return key


# --- core --------------------------------------------------------------------------------------------------
# Django's debug pages (a traceback with the process's settings, to anyone who can make a request fail) only when
# asked for: DJANGO_DEBUG=1.
DEBUG = env_bool("DJANGO_DEBUG", False)
# Production: SECRET_KEY and ALLOWED_HOSTS required, secure cookies, the HTTPS redirect and HSTS. On with
# TANDEM_PRODUCTION=1, or with DJANGO_DEBUG=0 set explicitly (production's switch before debug was off by default).
PRODUCTION = env_bool("TANDEM_PRODUCTION", env_str("DJANGO_DEBUG") is not None and not DEBUG)
VAR_DIR = Path(env_str("TANDEM_VAR_DIR", str(BASE_DIR / "var"))).resolve()
# var/ holds the SQLite database (sessions, token hashes, channel signing secrets), the secret key and the broker:
# only its owner may enter it. Files the control plane writes there are 0600 (controlplane.apps).
VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
if VAR_DIR.stat().st_uid == os.getuid() and VAR_DIR.stat().st_mode & 0o077:
    VAR_DIR.chmod(0o700)
SECRET_KEY = _secret_key(PRODUCTION, VAR_DIR)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1", "[::1]", "testserver"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set in production (comma-separated host names)")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    "axes",
    "csp",
    "controlplane.apps.ControlPlaneConfig",
    "dashboards.apps.DashboardsConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # Before CommonMiddleware's APPEND_SLASH redirect: the API serves its paths without the slash too.
    "controlplane.lib.api_paths.ApiTrailingSlash",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last: it turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

# --- abuse limits -------------------------------------------------------------------------------------------
# Failed sign-ins (django-axes): after TANDEM_LOGIN_FAILURE_LIMIT failures from one address for one username, that
# pair is locked out for TANDEM_LOGIN_COOLOFF_S; a success resets the count.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("TANDEM_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("TANDEM_LOGIN_COOLOFF_S", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
AXES_USERNAME_FORM_FIELD = "username"
# Content-Security-Policy (django-csp) on every page: scripts and everything else only from this origin (plotly.js
# and the dashboard script are served from here); styles also inline (plotly.js writes its own <style> elements).
CONTENT_SECURITY_POLICY = {"DIRECTIVES": {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}}

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database ----------------------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'tandem.sqlite3'}"
try:
    # TANDEM_DB_CONN_MAX_AGE > 0 keeps each thread's database connection for that many seconds (checked before
    # reuse) instead of one per request or task: at a thousand workers, fifty gateways polling their membership and
    # the periodic passes opened ~20 PostgreSQL sessions a second. For gunicorn's and Celery's long-lived threads;
    # `runserver` starts a thread per request, which cannot reuse one.
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("TANDEM_DB_CONN_MAX_AGE", 0, minimum=0),
                                conn_health_checks=True)
except Exception as exc:  # dj-database-url raises several kinds for an unknown scheme or a bad URL
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r} cannot be parsed: {exc}") from None
# A per-run test database name: engineers (and CI's two suites) run pytest at the same time on one machine;
# a fixed name would make their runs drop each other's database. TANDEM_TEST_DB_NAME pins it when needed.
_test_suffix = env_str("TANDEM_TEST_DB_NAME") or f"tandem_test_{os.getpid()}"
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write this file at once (web, Celery, the node agent): WAL lets readers run beside a
    # writer, IMMEDIATE takes the write lock at BEGIN (no deadlocking lock upgrades), timeout waits instead of
    # failing with "database is locked".
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file (not :memory:) so that integration tests can hand it to the processes they start.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"{_test_suffix}.sqlite3")}
else:
    _db["TEST"] = {"NAME": _test_suffix}
DATABASES = {"default": _db}
# The debug page shows settings; these carry passwords inside URLs, which Django's own filter does not see.
DEFAULT_EXCEPTION_REPORTER_FILTER = "controlplane.lib.reporting.CredentialFilter"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth --------------------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
# Production: `manage.py collectstatic` then serve STATIC_ROOT from the reverse proxy (README).
STATIC_ROOT = Path(env_str("TANDEM_STATIC_ROOT", str(VAR_DIR / "static")))

# --- security (all on in production, so `check --deploy` is clean) ----------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # Load balancers probe /healthz over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    if env_bool("TANDEM_BEHIND_TLS_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- REST API ----------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: DRF answers 401 with WWW-Authenticate from the first authenticator, so anonymous gets 401.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "controlplane.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.auth.IsViewer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.api.exceptions.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer",
                                 "rest_framework.renderers.BrowsableAPIRenderer"],
    # DRF's, refusing NUL characters (PostgreSQL stores none): see controlplane/api/parsers.py.
    "DEFAULT_PARSER_CLASSES": ["controlplane.api.parsers.JSONParser",
                               "controlplane.api.parsers.FormParser",
                               "controlplane.api.parsers.MultiPartParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # The client address the throttles key on: the connection's, unless this many proxies of ours stand in front
    # (then the address they appended to X-Forwarded-For). A header as the client sent it is never trusted.
    "NUM_PROXIES": env_int("TANDEM_TRUSTED_PROXIES", 0, minimum=0),
}
# Clients that keep presenting invalid tokens are answered 429 past this rate (per client address; DRF's rate
# syntax: N/s, N/min, N/hour). Counted in CACHES, which TANDEM_CACHE_URL points at Redis for several web processes.
TANDEM_FAILED_TOKEN_RATE = env_str("TANDEM_FAILED_TOKEN_RATE", "20/min")
_cache_url = env_str("TANDEM_CACHE_URL")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}
          if _cache_url else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tandem control plane API",
    "DESCRIPTION": (
        "Runs and operates disaggregated (prefill/decode) and colocated LLM inference deployments. "
        "Authenticate with `Authorization: Token <key>` (`manage.py tandem_token USER --role ROLE`) or a "
        "browser session. Roles: viewer reads everything; operator also scales pools, restarts and drains "
        "workers and rolls deployments back; admin also creates and deletes deployments and revisions. "
        "Writes answer 202 with the action row that records them: poll `/api/v1/actions/{id}/` for its outcome."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "PoolRoleEnum": "controlplane.models.deployments.PoolRole",
        "WorkerRoleEnum": "controlplane.models.workers.WorkerRole",
        "WorkerStatusEnum": "controlplane.models.workers.WorkerStatus",
        "ActionStatusEnum": "controlplane.models.actions.ActionStatus",
        "ActionKindEnum": "controlplane.models.actions.ActionKind",
        "ActorTypeEnum": "controlplane.models.actions.ActorType",
        "DeploymentModeEnum": "controlplane.models.deployments.DeploymentMode",
        "ChannelKindEnum": "controlplane.alerting.models.channels.ChannelKind",
        "AlertStateEnum": "controlplane.alerting.models.alerts.AlertState",
        "AutoscaleModeEnum": "controlplane.autoscaling.models.AutoscaleMode",
    },
}

# --- Celery --------------------------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    # One machine only: the filesystem transport loses in-flight messages on a crash (README).
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport with atomic message files (controlplane/lib/broker.py).
    CELERY_BROKER_TRANSPORT = "controlplane.lib.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # Exchange tables (broadcast, pidbox) would otherwise land in the current directory.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
# A broker that stops answering must never hold a request: publishing waits at most this long (the change is
# committed first; reconcile picks it up when the broker is back), and broker sockets give up after it.
TANDEM_BROKER_TIMEOUT_S = env_int("TANDEM_BROKER_TIMEOUT_S", 2, minimum=1, maximum=60)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_timeout": TANDEM_BROKER_TIMEOUT_S,
                                       "socket_connect_timeout": TANDEM_BROKER_TIMEOUT_S}
CELERY_BROKER_CONNECTION_TIMEOUT = TANDEM_BROKER_TIMEOUT_S
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2,
                                    "interval_max": 0.2}
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or "django-db"
CELERY_RESULT_EXTENDED = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Tandem --------------------------------------------------------------------------------------------------
TANDEM_WEB_PORT = env_int("TANDEM_WEB_PORT", 8000, minimum=1, maximum=65535)
TANDEM_GATEWAY_PORT = env_int("TANDEM_GATEWAY_PORT", 8001, minimum=1, maximum=65535)
TANDEM_PUBLIC_URL = (env_str("TANDEM_PUBLIC_URL") or f"http://127.0.0.1:{TANDEM_WEB_PORT}").rstrip("/")
TANDEM_NODE_NAME = env_str("TANDEM_NODE_NAME") or "local"
# The address this host's workers are reached at by the gateway and the control plane (one host: loopback).
TANDEM_NODE_ADDRESS = env_str("TANDEM_NODE_ADDRESS") or "127.0.0.1"
TANDEM_LOG_DIR = Path(env_str("TANDEM_LOG_DIR", str(VAR_DIR / "logs")))
TANDEM_MODELS_DIR = Path(env_str("TANDEM_MODELS_DIR", str(VAR_DIR / "models")))
TANDEM_HEALTH_FAILURES = env_int("TANDEM_HEALTH_FAILURES", 3, minimum=1)
TANDEM_MAX_RESTARTS = env_int("TANDEM_MAX_RESTARTS", 5, minimum=0)
TANDEM_RESTART_WINDOW_S = env_int("TANDEM_RESTART_WINDOW_S", 600, minimum=1)
TANDEM_RECONCILE_INTERVAL_S = env_int("TANDEM_RECONCILE_INTERVAL_S", 2, minimum=1)
TANDEM_STOP_DEADLINE_S = env_int("TANDEM_STOP_DEADLINE_S", 10, minimum=1)
# The share of a CPU host's RAM that the KV pools of the workers placed on it hold together (the node agent hands
# each worker its part: controlplane/agent/launch.py's kv_budget_for). A pool takes RAM only for the blocks in use.
TANDEM_KV_HOST_PERCENT = env_int("TANDEM_KV_HOST_PERCENT", 40, minimum=1, maximum=90)
TANDEM_DEMO_MODEL = env_str("TANDEM_DEMO_MODEL") or "smollm2"
if TANDEM_DEMO_MODEL not in ("smollm2", "tiny"):
    raise ImproperlyConfigured(f"TANDEM_DEMO_MODEL={TANDEM_DEMO_MODEL!r} must be 'smollm2' or 'tiny'")
TANDEM_DEMO_LOAD = env_bool("TANDEM_DEMO_LOAD", True)
# vllm: make run also serves the demo model from a vLLM worker, the deployment `demo-vllm` (colocated, its gateway on
# TANDEM_GATEWAY_PORT + 1), beside the disaggregated `demo` of Tandem's own workers (docs/engines.md).
TANDEM_DEMO_ENGINE = env_str("TANDEM_DEMO_ENGINE") or "tandem"
if TANDEM_DEMO_ENGINE not in ("tandem", "vllm"):
    raise ImproperlyConfigured(f"TANDEM_DEMO_ENGINE={TANDEM_DEMO_ENGINE!r} must be 'tandem' or 'vllm'")
# make run gives the demo's decode role INT8 weights where the CPU has an int8 dot product (faster decode steps; the
# decode worker's own copy of the weights: ~0.5 GiB more than the demo's 2 GB). Off by default.
TANDEM_DEMO_DECODE_INT8 = env_bool("TANDEM_DEMO_DECODE_INT8", False)
TANDEM_ADMIN_PASSWORD = env_str("TANDEM_ADMIN_PASSWORD")
# The max_replicas a new pool gets when the request names none (min defaults to 1, or 0 for 0 replicas).
TANDEM_DEFAULT_MAX_REPLICAS = 8
# The hard ceiling of any pool: a typo like 10000 replicas must be refused, not attempted.
TANDEM_MAX_REPLICAS_LIMIT = env_int("TANDEM_MAX_REPLICAS_LIMIT", 64, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("TANDEM_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# --- the control plane's own apps, and their settings (controlplane/settings_fleet.py) ---------------------
INSTALLED_APPS += ["controlplane.observability.apps.ObservabilityConfig"]
INSTALLED_APPS += ["controlplane.rollouts.apps.RolloutsConfig"]
INSTALLED_APPS += ["controlplane.chaos.apps.ChaosConfig"]
INSTALLED_APPS += ["controlplane.autoscaling.apps.AutoscalingConfig"]
INSTALLED_APPS += ["controlplane.capacity.apps.CapacityConfig"]
INSTALLED_APPS += ["controlplane.tenants.apps.TenantsConfig"]
INSTALLED_APPS += ["controlplane.alerting.apps.AlertingConfig"]
INSTALLED_APPS += ["controlplane.replay.apps.ReplayConfig"]

from controlplane.settings_fleet import *  # noqa: E402,F401,F403
