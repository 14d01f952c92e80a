from __future__ import annotations

import logging

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request):
    """The web process is up and can query its database. No auth: load balancers and `tandem_run` probe it."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "not healthy", which is the answer, not a crash
        log.warning("healthz: database check failed: %s", exc)
        return JsonResponse({"status": "error", "database": f"error: {type(exc).__name__}"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
