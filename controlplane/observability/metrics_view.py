"""GET /metrics of the web process: the control plane's own Prometheus text.

Access: a viewer (or higher) token, sent as `Authorization: Bearer <token>` (Prometheus' `authorization` /
`bearer_token` config) or `Authorization: Token <token>` (the REST API's scheme), or a signed-in session. It is not
open on localhost: behind a reverse proxy every request comes from localhost, and the action counts and deployment
names are fleet data. Anything else answers 401 (403 for a user without a role).
"""
from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework.exceptions import AuthenticationFailed, Throttled

from controlplane.auth import Role, has_role, token_for
from controlplane.observability.telemetry import REGISTRY


def _token_user(request):
    """The user of the request's bearer or REST API token (controlplane.auth.token_for), None for any other."""
    try:
        token = token_for(request)
    except AuthenticationFailed:
        return None
    return token.user if token is not None else None


@require_GET
def metrics(request):
    try:
        user = _token_user(request) if "Authorization" in request.headers else request.user
    except Throttled as throttled:
        # A client that kept presenting bad tokens: the same 429 the API gives it.
        response = HttpResponse(f"429: {throttled.detail}\n", status=429, content_type="text/plain")
        response["Retry-After"] = str(int(throttled.wait or 1))
        return response
    if user is None or not user.is_authenticated:
        response = HttpResponse("401: send Authorization: Bearer <token> of a viewer (or higher)\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="tandem"'
        return response
    if not has_role(user, Role.VIEWER):
        return HttpResponse("403: this needs the viewer role (or higher)\n", status=403, content_type="text/plain")
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
