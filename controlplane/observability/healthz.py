"""GET /healthz, for load balancers, `tandem_run` and operators: no auth. How the control plane itself is doing,
beside its own /metrics (metrics_view.py).

503 when the web process cannot query its database (it cannot serve). Otherwise 200, with `status` "ok" or
"degraded" and what is wrong: the database refuses writes (read-only: the API's writes answer 503), the broker does
not answer, Prometheus (TANDEM_METRICS_BACKEND=prometheus) does not (the alert evaluator and autoscaler then hold
still), the health pass holds its restarts (many probes timed out at once: supervision.probe_hold), or a periodic
pass (reconcile, health, scrape, alert evaluation) has not run for 5 of its intervals (the broker frozen, the Celery
workers gone or wedged). Degraded is still 200: restarting the web process would not mend
any of these, and a load balancer should keep sending it the API.
Each probe, while the database takes writes, sends `probed` with the loops' freshness: the alerting app steps its
control-loop alert on it (alerting.services.watchdog), so this app does not depend on that one.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings
from django.db import connection
from django.dispatch import Signal
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from controlplane.observability.reader import reader
from controlplane.observability.telemetry import cycle_freshness
from controlplane.selectors import health_hold_get

log = logging.getLogger(__name__)

# Sent by every probe while the database takes writes, with `freshness` (telemetry.cycle_freshness).
probed = Signal()

STARTED = time.time()  # a pass that never ran is counted from here, so a fresh start is not "stale"
BROKER_CHECK_TTL_S = 5.0  # probes come every few seconds: one broker connection per this long at most
_broker_lock = threading.Lock()
_broker_cache: tuple[float, str] | None = None
_last_problems: list[str] = []


def _broker_state() -> str:
    """"ok" or "error: …": the broker takes a connection (AMQP, Redis) or its folders are writable (filesystem)."""
    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        for key in ("data_folder_in", "data_folder_out"):
            folder = options.get(key)
            if folder and not os.access(folder, os.W_OK | os.X_OK):
                return f"error: the broker folder {folder} is not writable"
        return "ok"
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=settings.TANDEM_BROKER_TIMEOUT_S,
                        transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}) as conn:
            conn.ensure_connection(max_retries=1, timeout=settings.TANDEM_BROKER_TIMEOUT_S)
    except Exception as exc:  # any transport error is the answer
        return f"error: {type(exc).__name__}: {exc}"[:300]
    return "ok"


def broker_state() -> str:
    global _broker_cache
    with _broker_lock:
        if _broker_cache is None or time.monotonic() - _broker_cache[0] > BROKER_CHECK_TTL_S:
            _broker_cache = (time.monotonic(), _broker_state())
        return _broker_cache[1]


def _database_read_only(cursor) -> str | None:
    """Why the database refuses writes (PostgreSQL: a read-only default or a standby; SQLite: query_only or a file
    this process may not write), or None. Reads still serve, so this is "degraded", not 503."""
    if connection.vendor == "postgresql":
        cursor.execute("SHOW transaction_read_only")
        return "read-only (transaction_read_only is on)" if cursor.fetchone()[0] == "on" else None
    if connection.vendor == "sqlite":
        cursor.execute("PRAGMA query_only")
        if cursor.fetchone()[0]:
            return "read-only (query_only)"
        name = str(connection.settings_dict["NAME"])
        if os.path.exists(name) and not os.access(name, os.W_OK):
            return f"read-only (the file {name} is not writable)"
    return None


@never_cache
@require_GET
def healthz(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
            read_only = _database_read_only(cursor)
    except Exception as exc:  # any driver error means "not healthy", which is the answer, not a crash
        log.warning("healthz: database check failed: %s", exc)
        return JsonResponse({"status": "error", "database": f"error: {type(exc).__name__}"}, status=503)
    loops = cycle_freshness(STARTED)
    if not read_only:
        # The probes that load balancers send every few seconds step the control-loop alert: no beat, broker or
        # Celery worker needed, so it fires when those are what stopped. A receiver's error never fails the probe.
        for receiver, result in probed.send_robust(sender=None, freshness=loops):
            if isinstance(result, Exception):
                log.warning("healthz: %s failed: %s", getattr(receiver, "__name__", receiver), result)
    broker = broker_state()
    problems = [f"database {read_only}: API writes answer 503"] if read_only else []
    if broker != "ok":
        problems.append(f"broker {broker}")
    metrics_problem = reader().problem()  # None for the embedded store; Prometheus: cached readiness probe
    if metrics_problem is not None:
        problems.append(f"{metrics_problem}: alert evaluation and the autoscaler hold still")
    hold = health_hold_get()
    if hold is not None:
        problems.append(f"health restarts held since {hold['since']}: {hold['reason']}")
    problems += [f"no {kind} pass for {loop['age_s']:.0f} s (stale after {loop['stale_after_s']:.0f} s)"
                 for kind, loop in loops.items() if loop["stale"]]
    body = {"status": "degraded" if problems else "ok", "database": read_only or "ok", "broker": broker,
            "control_loops": loops, "metrics_backend": {"name": reader().name, "state": metrics_problem or "ok"},
            "health_restarts": {"held": hold is not None, **(hold or {})}}
    if problems:
        body["problems"] = problems
    global _last_problems
    if problems != _last_problems:  # once per change, not once per probe
        log.warning("healthz: %s", "degraded: " + "; ".join(problems) if problems else "ok again")
        _last_problems = problems
    return JsonResponse(body)
